#include "kiln/te/cuda/grouped_gemm_cublas.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/error.h"

namespace kiln::te::cuda {

namespace {

// False while the tensor's stream is capturing a CUDA graph (no read-back possible) or when
// KILN_GROUPED_GEMM=tc asks for the device-offsets kernel.
bool may_read_back(const Tensor& t) {
  const char* forced = std::getenv("KILN_GROUPED_GEMM");
  if (forced && std::strcmp(forced, "tc") == 0) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(kiln::cuda_stream(t.device().index), &status));
  return status == cudaStreamCaptureStatusNone;
}

// Rows lo .. lo + n of a contiguous [R, C] matrix as the [1, n, C] batch ops::gemm_into takes.
Tensor rows_of(const Tensor& t, std::int64_t lo, std::int64_t n) { return t.narrow(0, lo, n).view({1, n, t.size(1)}); }
// Expert e's [A, B] matrix of a [E, A, B] tensor as a [1, A, B] batch.
Tensor matrix_of(const Tensor& t, std::int64_t e) { return t.select(0, e).view({1, t.size(1), t.size(2)}); }

}  // namespace

bool grouped_gemm_cublas(const Tensor& x, const Tensor& w, const Tensor& offsets, bool trans_w, const Tensor& y) {
  if (!may_read_back(x)) return false;
  const std::vector<std::int64_t> off = offsets.to_vector<std::int64_t>();  // synchronises: see the header
  const std::int64_t experts = w.size(0), rows = x.size(0);
  KILN_CHECK(static_cast<std::int64_t>(off.size()) == experts + 1 && off.back() <= rows,
             "grouped_gemm: offsets {} do not fit {} experts over {} rows", offsets.describe(), experts, rows);
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t lo = off[static_cast<std::size_t>(e)], n = off[static_cast<std::size_t>(e) + 1] - lo;
    if (n > 0) ops::gemm_into(rows_of(x, lo, n), matrix_of(w, e), rows_of(y, lo, n), false, !trans_w, 1, 0);
  }
  if (off.back() < rows) y.narrow(0, off.back(), rows - off.back()).zero_();  // the unused tail rows
  return true;
}

bool grouped_gemm_wgrad_cublas(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dw) {
  if (!may_read_back(x)) return false;
  const std::vector<std::int64_t> off = offsets.to_vector<std::int64_t>();
  const std::int64_t experts = dw.size(0);
  KILN_CHECK(static_cast<std::int64_t>(off.size()) == experts + 1 && off.back() <= x.size(0),
             "grouped_gemm_wgrad: offsets {} do not fit {} experts over {} rows", offsets.describe(), experts,
             x.size(0));
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t lo = off[static_cast<std::size_t>(e)], n = off[static_cast<std::size_t>(e) + 1] - lo;
    if (n > 0) {
      ops::gemm_into(rows_of(dy, lo, n), rows_of(x, lo, n), matrix_of(dw, e), true, false, 1, 0);
    } else {
      dw.select(0, e).zero_();
    }
  }
  return true;
}

}  // namespace kiln::te::cuda
