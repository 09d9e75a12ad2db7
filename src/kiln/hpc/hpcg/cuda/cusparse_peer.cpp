// The cuSPARSE peer: the fine-level reference matrix of a one-process nx x ny x nz problem in
// natural-order CSR (what a cuSPARSE user would build), y = Ax by cusparseSpMV, timed with CUDA
// events in the same process as Kiln's copy-bandwidth measurement. The matrix is generated on the
// device (kernels.cu).
// Indices are 32-bit while the nonzeros fit, else 64-bit (cuSPARSE takes one index type for both).
#include <algorithm>
#include <bit>
#include <vector>

#include "kiln/hpc/hpcg/cuda/kernels.h"
#include "kiln/hpc/hpcg/peers.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/event.h"
#include "kiln/runtime/vendor/cusparse.h"

namespace kiln::hpcg {

namespace {

template <class Index>
SpmvPeerResult run_peer(int nx, int ny, int nz, int device, cusparseIndexType_t index_type) {
  DeviceGuard guard(device);
  auto& backend = backend_for(Device::cuda(device));
  cudaStream_t stream = cuda_stream(device);
  SpmvPeerResult r;
  r.rows = std::int64_t{nx} * ny * nz;
  r.nonzeros = (3 * std::int64_t{nx} - 2) * (3 * std::int64_t{ny} - 2) * (3 * std::int64_t{nz} - 2);
  auto alloc = [&](std::size_t bytes) { return backend.allocate(bytes, device); };
  auto* offsets = static_cast<Index*>(alloc(static_cast<std::size_t>(r.rows + 1) * sizeof(Index)));
  auto* columns = static_cast<Index*>(alloc(static_cast<std::size_t>(r.nonzeros) * sizeof(Index)));
  auto* values = static_cast<double*>(alloc(static_cast<std::size_t>(r.nonzeros) * sizeof(double)));
  auto* x = static_cast<double*>(alloc(static_cast<std::size_t>(r.rows) * sizeof(double)));
  auto* y = static_cast<double*>(alloc(static_cast<std::size_t>(r.rows) * sizeof(double)));
  auto* expected = static_cast<double*>(alloc(static_cast<std::size_t>(r.rows) * sizeof(double)));
  auto* worst = static_cast<unsigned long long*>(alloc(sizeof(unsigned long long)));
  gpu::generate_csr(nx, ny, nz, offsets, columns, values, expected, stream);
  KILN_CUDA_CHECK_LAUNCH();
  gpu::fill(r.rows, 1.0, x, stream);
  KILN_CUDA_CHECK_LAUNCH();

  cusparseHandle_t handle = nullptr;
  KILN_CUSPARSE_CHECK(cusparseCreate(&handle));
  KILN_CUSPARSE_CHECK(cusparseSetStream(handle, stream));
  cusparseSpMatDescr_t A = nullptr;
  cusparseDnVecDescr_t vx = nullptr, vy = nullptr;
  KILN_CUSPARSE_CHECK(cusparseCreateCsr(&A, r.rows, r.rows, r.nonzeros, offsets, columns, values, index_type,
                                        index_type, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
  KILN_CUSPARSE_CHECK(cusparseCreateDnVec(&vx, r.rows, x, CUDA_R_64F));
  KILN_CUSPARSE_CHECK(cusparseCreateDnVec(&vy, r.rows, y, CUDA_R_64F));
  double one = 1.0, zero = 0.0;
  std::size_t buffer_bytes = 0;
  KILN_CUSPARSE_CHECK(cusparseSpMV_bufferSize(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, vx, &zero, vy,
                                              CUDA_R_64F, CUSPARSE_SPMV_CSR_ALG1, &buffer_bytes));
  void* buffer = buffer_bytes ? alloc(buffer_bytes) : nullptr;
  auto spmv = [&] {
    KILN_CUSPARSE_CHECK(cusparseSpMV(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, vx, &zero, vy, CUDA_R_64F,
                                     CUSPARSE_SPMV_CSR_ALG1, buffer));
  };
  spmv();  // warm-up, and the correctness check: A * ones must be the reference's b
  KILN_CUDA_CHECK(cudaMemsetAsync(worst, 0, sizeof(unsigned long long), stream));
  gpu::max_abs_difference_bits(r.rows, y, expected, worst, stream);
  KILN_CUDA_CHECK_LAUNCH();
  unsigned long long bits = 0;
  KILN_CUDA_CHECK(cudaMemcpyAsync(&bits, worst, sizeof bits, cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  r.max_difference = std::bit_cast<double>(bits);

  Device dev = Device::cuda(device);
  std::vector<double> ms;
  r.repetitions = 20;
  for (int rep = 0; rep < r.repetitions; ++rep) {
    Event start(dev), stop(dev);
    start.record();
    spmv();
    stop.record();
    ms.push_back(stop.elapsed_ms(start));
  }
  std::sort(ms.begin(), ms.end());
  r.seconds_per_call = ms[ms.size() / 2] * 1e-3;
  r.gflops = 2.0 * static_cast<double>(r.nonzeros) / r.seconds_per_call / 1e9;
  double bytes =
      static_cast<double>(r.nonzeros) * (8.0 + sizeof(Index)) + static_cast<double>(r.rows) * (sizeof(Index) + 16.0);
  r.bandwidth = bytes / r.seconds_per_call;

  KILN_CUSPARSE_CHECK(cusparseDestroyDnVec(vx));
  KILN_CUSPARSE_CHECK(cusparseDestroyDnVec(vy));
  KILN_CUSPARSE_CHECK(cusparseDestroySpMat(A));
  KILN_CUSPARSE_CHECK(cusparseDestroy(handle));
  for (void* p : {static_cast<void*>(offsets), static_cast<void*>(columns), static_cast<void*>(values),
                  static_cast<void*>(x), static_cast<void*>(expected), static_cast<void*>(worst), buffer})
    if (p) backend.deallocate(p, device);

  // Copy bandwidth in the same process, on the y buffer's worth of memory and more.
  std::size_t copy_bytes = std::size_t{1} << 31;
  void* a = backend.allocate(copy_bytes, device);
  void* b = backend.allocate(copy_bytes, device);
  backend.memset_zero(a, copy_bytes, device);
  for (int rep = 0; rep < 6; ++rep) {
    Event start(dev), stop(dev);
    start.record();
    backend.copy_on_device(b, a, copy_bytes, device);
    stop.record();
    double t = stop.elapsed_ms(start) * 1e-3;
    if (rep > 0) r.copy_bandwidth = std::max(r.copy_bandwidth, 2.0 * static_cast<double>(copy_bytes) / t);
  }
  backend.deallocate(a, device);
  backend.deallocate(b, device);
  backend.deallocate(y, device);
  return r;
}

}  // namespace

SpmvPeerResult run_cusparse_spmv_peer(int nx, int ny, int nz, int device_index) {
  KILN_CHECK(nx >= 2 && ny >= 2 && nz >= 2, "hpcg peer: {}x{}x{} is too small", nx, ny, nz);
  std::int64_t nnz = (3 * std::int64_t{nx} - 2) * (3 * std::int64_t{ny} - 2) * (3 * std::int64_t{nz} - 2);
  if (nnz < (std::int64_t{1} << 31) - 1) return run_peer<int>(nx, ny, nz, device_index, CUSPARSE_INDEX_32I);
  return run_peer<std::int64_t>(nx, ny, nz, device_index, CUSPARSE_INDEX_64I);
}

}  // namespace kiln::hpcg
