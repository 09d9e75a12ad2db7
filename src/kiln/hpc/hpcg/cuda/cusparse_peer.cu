// The cuSPARSE peer: the fine-level reference matrix of a one-process nx x ny x nz problem in
// natural-order CSR (what a cuSPARSE user would build), y = Ax by cusparseSpMV, timed with CUDA
// events in the same process as Kiln's copy-bandwidth measurement. The matrix is generated on the
// device: row offsets have a closed form (nonzeros per point factor by axis), so no scan is needed.
// Indices are 32-bit while the nonzeros fit, else 64-bit (cuSPARSE takes one index type for both).
#include <algorithm>
#include <bit>
#include <vector>

#include "kiln/hpc/hpcg/layout.h"
#include "kiln/hpc/hpcg/peers.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/event.h"
#include "kiln/runtime/vendor/cusparse.h"

namespace kiln::hpcg {

namespace {

constexpr int kThreads = 256;

// Nonzeros of the points before index i along an axis of n points, and of the point at i.
__host__ __device__ inline std::int64_t axis_prefix(int i, int n) { return i == 0 ? 0 : 2 + 3 * std::int64_t{i - 1}; }
__host__ __device__ inline int axis_count(int i, int n) { return 1 + (i > 0) + (i < n - 1); }

template <class Index>
__global__ void generate_csr_kernel(int nx, int ny, int nz, Index* offsets, Index* columns, double* values,
                                    double* expected) {
  std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t nrow = std::int64_t{nx} * ny * nz;
  if (row >= nrow) return;
  int i = static_cast<int>(row % nx), j = static_cast<int>((row / nx) % ny), k = static_cast<int>(row / (std::int64_t{nx} * ny));
  std::int64_t sx = 3 * std::int64_t{nx} - 2, sy = 3 * std::int64_t{ny} - 2;
  std::int64_t start = axis_prefix(k, nz) * sx * sy + axis_prefix(j, ny) * sx * axis_count(k, nz) +
                       axis_prefix(i, nx) * axis_count(j, ny) * axis_count(k, nz);
  offsets[row] = static_cast<Index>(start);
  if (row == nrow - 1) offsets[nrow] = static_cast<Index>(start + axis_count(i, nx) * axis_count(j, ny) * axis_count(k, nz));
  std::int64_t e = start;
  int present = 0;
  for (int dz = -1; dz <= 1; ++dz)
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx) {
        int a = i + dx, b = j + dy, c = k + dz;
        if (a < 0 || b < 0 || c < 0 || a >= nx || b >= ny || c >= nz) continue;
        bool diagonal = dx == 0 && dy == 0 && dz == 0;
        columns[e] = static_cast<Index>(a + std::int64_t{nx} * (b + std::int64_t{ny} * c));
        values[e] = diagonal ? 26.0 : -1.0;
        ++e;
        present += diagonal ? 0 : 1;
      }
  expected[row] = 26.0 - present;  // A * ones = b of the reference problem
}

__global__ void fill_ones_kernel(std::int64_t n, double* v) {
  std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v[i] = 1.0;
}

__global__ void max_diff_kernel(std::int64_t n, const double* a, const double* b, unsigned long long* out) {
  std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double d = fabs(a[i] - b[i]);
  // Non-negative doubles order like their bit patterns.
  if (d > 0) atomicMax(out, static_cast<unsigned long long>(__double_as_longlong(d)));
}

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
  auto grid = static_cast<unsigned>((r.rows + kThreads - 1) / kThreads);
  generate_csr_kernel<Index><<<grid, kThreads, 0, stream>>>(nx, ny, nz, offsets, columns, values, expected);
  KILN_CUDA_CHECK_LAUNCH();
  fill_ones_kernel<<<grid, kThreads, 0, stream>>>(r.rows, x);
  KILN_CUDA_CHECK_LAUNCH();

  cusparseHandle_t handle = nullptr;
  KILN_CUSPARSE_CHECK(cusparseCreate(&handle));
  KILN_CUSPARSE_CHECK(cusparseSetStream(handle, stream));
  cusparseSpMatDescr_t A = nullptr;
  cusparseDnVecDescr_t vx = nullptr, vy = nullptr;
  KILN_CUSPARSE_CHECK(cusparseCreateCsr(&A, r.rows, r.rows, r.nonzeros, offsets, columns, values, index_type, index_type,
                                        CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
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
  max_diff_kernel<<<grid, kThreads, 0, stream>>>(r.rows, y, expected, worst);
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
  double bytes = static_cast<double>(r.nonzeros) * (8.0 + sizeof(Index)) + static_cast<double>(r.rows) * (sizeof(Index) + 16.0);
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
