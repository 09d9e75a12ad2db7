#include "kiln/te/cuda/grouped_gemm_cublas.h"

#include <atomic>
#include <initializer_list>
#include <mutex>
#include <vector>

#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/error.h"
#include "kiln/te/cuda/device_pointer_table.h"
#include "kiln/te/cuda/grouped_gemm_chunked.h"
#include "kiln/te/cuda/grouped_gemm_types.h"
#include "kiln/te/grouped_gemm_args.h"

namespace kiln::te::cuda {

namespace {

std::atomic<std::int64_t> grouped_calls{0};

bool capturing(const Tensor& t) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(kiln::cuda_stream(t.device().index), &status));
  return status != cudaStreamCaptureStatusNone;
}

// One cuBLAS handle per device, made on first use. Its workspace is cuBLAS's own default pool:
// cublasSetStream (called before every use, as the thread's current stream may differ) would reset
// a workspace set with cublasSetWorkspace back to that pool anyway.
cublasHandle_t blas_handle(int index) {
  static cublasHandle_t handles[64];
  static std::once_flag once[64];
  KILN_CHECK(index >= 0 && index < 64, "cuBLAS: device index {} out of range", index);
  std::call_once(once[index], [index] {
    DeviceGuard guard(index);
    KILN_CUBLAS_CHECK(cublasCreate(&handles[index]));
  });
  return handles[index];
}

// Runs `args` as one cublasGemmGroupedBatchedEx call on tensors a, b, c (the roles of
// te/grouped_gemm_args.h). False, having done nothing, where the call does not apply: a dtype it
// does not take, a dimension past 32 bits, or an operand pointer not 16-byte aligned (what cuBLAS
// asks of bf16/f16 pointers; checked for every dtype to keep one rule).
bool run_grouped(const GroupedGemmArgs& args, const Tensor& a, const Tensor& b, const Tensor& c) {
  cudaDataType_t type{};
  cublasComputeType_t compute{};
  if (a.dtype() != b.dtype() || a.dtype() != c.dtype() || !grouped_gemm_types(a.dtype(), &type, &compute)) return false;
  if (!args.fits_int32()) return false;
  const std::size_t p = args.problems();
  if (p == 0) return true;
  const std::size_t elem = a.element_size();
  std::vector<const void*> table(3 * p);
  auto address = [elem](const Tensor& t, std::int64_t offset) {
    return static_cast<const void*>(static_cast<const char*>(t.data_ptr()) + static_cast<std::size_t>(offset) * elem);
  };
  for (std::size_t i = 0; i < p; ++i) {
    table[i] = address(a, args.a[i]);
    table[p + i] = address(b, args.b[i]);
    table[2 * p + i] = address(c, args.c[i]);
  }
  for (const void* ptr : table)
    if (reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0) return false;

  const std::size_t g = args.groups.size();
  std::vector<cublasOperation_t> trans_a(g), trans_b(g);
  std::vector<int> m(g), n(g), k(g), lda(g), ldb(g), ldc(g), size(g);
  const std::vector<float> alpha(g, 1.0f), beta(g, 0.0f);
  for (std::size_t i = 0; i < g; ++i) {
    const GemmGroup& gr = args.groups[i];
    trans_a[i] = gr.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    trans_b[i] = gr.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    m[i] = static_cast<int>(gr.m), n[i] = static_cast<int>(gr.n), k[i] = static_cast<int>(gr.k);
    lda[i] = static_cast<int>(gr.lda), ldb[i] = static_cast<int>(gr.ldb), ldc[i] = static_cast<int>(gr.ldc);
    size[i] = static_cast<int>(gr.size);
  }
  const int index = c.device().index;
  DeviceGuard guard(index);
  const cudaStream_t stream = kiln::cuda_stream(index);
  // The pointer arrays live on the device (cuBLAS reads them there); the scratch block goes back to
  // the stream's cache at scope end, and any later user of it is ordered after this call.
  ops::cuda::Scratch pointers(3 * p * sizeof(void*), index);
  void** dev = pointers.as<void*>();
  write_device_pointer_table(table.data(), table.size(), dev, stream);
  cublasHandle_t handle = blas_handle(index);
  KILN_CUBLAS_CHECK(cublasSetStream(handle, stream));
  const cublasStatus_t st = cublasGemmGroupedBatchedEx(
      handle, trans_a.data(), trans_b.data(), m.data(), n.data(), k.data(), alpha.data(), dev, type, lda.data(),
      dev + p, type, ldb.data(), beta.data(), dev + 2 * p, type, ldc.data(), static_cast<int>(g), size.data(), compute);
  KILN_CHECK(st == CUBLAS_STATUS_SUCCESS,
             "grouped_gemm: cublasGemmGroupedBatchedEx failed ({}, status {}) on {} problems in {} groups of {}; "
             "KILN_GROUPED_GEMM=loop runs one cuBLASLt GEMM per expert instead",
             cublasGetStatusName(st), static_cast<int>(st), p, g, dtype_name(a.dtype()));
  grouped_calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Rows lo .. lo + n of a contiguous [R, C] matrix as the [1, n, C] batch ops::gemm_into takes.
Tensor rows_of(const Tensor& t, std::int64_t lo, std::int64_t n) { return t.narrow(0, lo, n).view({1, n, t.size(1)}); }
// Expert e's [A, B] matrix of a [E, A, B] tensor as a [1, A, B] batch.
Tensor matrix_of(const Tensor& t, std::int64_t e) { return t.select(0, e).view({1, t.size(1), t.size(2)}); }

void check_operands(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    KILN_CHECK(t->is_contiguous() && t->device().kind == DeviceKind::CUDA,
               "{}: operands must be contiguous CUDA tensors (got {})", op, t->describe());
}

}  // namespace

std::int64_t grouped_gemm_grouped_calls() { return grouped_calls.load(std::memory_order_relaxed); }

void grouped_gemm_host_offsets(const Tensor& x, const Tensor& w, std::span<const std::int64_t> offsets, bool trans_w,
                               const Tensor& y, GroupedGemmPath requested) {
  const GroupedGemmPath path = resolve_grouped_gemm_path(requested, offsets);
  check_operands("grouped_gemm", {&x, &w, &y});
  const std::int64_t experts = w.size(0), rows = x.size(0), kdim = x.size(1), odim = y.size(1);
  KILN_CHECK(static_cast<std::int64_t>(offsets.size()) == experts + 1,
             "grouped_gemm: {} expert offsets for {} experts (expected E + 1)", offsets.size(), experts);
  const GroupedGemmArgs args =
      grouped_gemm_args(trans_w ? GroupedProduct::TransW : GroupedProduct::Forward, offsets, rows, kdim, odim);
  if (rows == 0 || odim == 0) return;
  if (kdim == 0) {      // every output row is an empty sum
    Tensor(y).zero_();  // a handle: zeroes y's storage
    return;
  }
  const bool done = path == GroupedGemmPath::Grouped   ? run_grouped(args, w, x, y)
                    : path == GroupedGemmPath::Chunked ? grouped_gemm_chunked(x, w, offsets, trans_w, y)
                                                       : false;
  if (!done) {
    for (std::int64_t e = 0; e < experts; ++e) {
      const std::int64_t lo = offsets[static_cast<std::size_t>(e)], n = offsets[static_cast<std::size_t>(e) + 1] - lo;
      if (n > 0) ops::gemm_into(rows_of(x, lo, n), matrix_of(w, e), rows_of(y, lo, n), false, !trans_w, 1, 0);
    }
  }
  if (args.used_rows < rows) y.narrow(0, args.used_rows, rows - args.used_rows).zero_();  // the unused tail rows
}

void grouped_gemm_wgrad_host_offsets(const Tensor& dy, const Tensor& x, std::span<const std::int64_t> offsets,
                                     const Tensor& dw, GroupedGemmPath path) {
  check_operands("grouped_gemm_wgrad", {&dy, &x, &dw});
  const std::int64_t experts = dw.size(0), odim = dw.size(1), kdim = dw.size(2);
  KILN_CHECK(static_cast<std::int64_t>(offsets.size()) == experts + 1,
             "grouped_gemm_wgrad: {} expert offsets for {} experts (expected E + 1)", offsets.size(), experts);
  KILN_CHECK(dy.size(0) == x.size(0), "grouped_gemm_wgrad: dy has {} rows, x {}", dy.size(0), x.size(0));
  const GroupedGemmArgs args = grouped_gemm_args(GroupedProduct::Wgrad, offsets, x.size(0), kdim, odim);
  if (dw.numel() == 0) return;
  // Auto: cuBLAS's grouped call where the forward took the chunked launches (an expert with few
  // rows): there the loop's per-expert GEMMs wait on their launches (bench_grouped_gemm, Qwen3-like
  // 128 experts: 2.19 / 3.31 a dense GEMM's time against the loop's 2.60 / 4.81, docs/PERF.md).
  const bool grouped =
      path == GroupedGemmPath::Grouped ||
      (path == GroupedGemmPath::Auto && resolve_grouped_gemm_path(path, offsets) == GroupedGemmPath::Chunked);
  if (grouped && run_grouped(args, x, dy, dw)) {
    for (std::int64_t e : args.empty_experts) dw.select(0, e).zero_();
    return;
  }
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t lo = offsets[static_cast<std::size_t>(e)], n = offsets[static_cast<std::size_t>(e) + 1] - lo;
    if (n > 0) {
      ops::gemm_into(rows_of(dy, lo, n), rows_of(x, lo, n), matrix_of(dw, e), true, false, 1, 0);
    } else {
      dw.select(0, e).zero_();
    }
  }
}

bool grouped_gemm_cublas(const Tensor& x, const Tensor& w, const Tensor& offsets, bool trans_w, const Tensor& y) {
  const GroupedGemmPath path = grouped_gemm_path();
  if (path == GroupedGemmPath::Tc || capturing(x)) return false;
  const std::vector<std::int64_t> off = offsets.to_vector<std::int64_t>();  // synchronises: see the header
  grouped_gemm_host_offsets(x, w, off, trans_w, y, path);
  return true;
}

bool grouped_gemm_wgrad_cublas(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dw) {
  const GroupedGemmPath path = grouped_gemm_path();
  if (path == GroupedGemmPath::Tc || capturing(x)) return false;
  const std::vector<std::int64_t> off = offsets.to_vector<std::int64_t>();
  grouped_gemm_wgrad_host_offsets(dy, x, off, dw, path);
  return true;
}

}  // namespace kiln::te::cuda
