#include "kiln/ops/linalg.h"

#include "kiln/ops/checks.h"
#include "kiln/ops/kernels.h"

namespace kiln::ops {

namespace {
void check_gemm(const Tensor& a, const Tensor& b, bool ta, bool tb, std::int64_t& m, std::int64_t& n) {
  check_compatible("matmul", a, b);
  check_floating("matmul", a);
  KILN_CHECK(a.dim() == 3 && b.dim() == 3 && a.is_contiguous() && b.is_contiguous(),
             "gemm: expected contiguous 3-D operands, got {} and {}", a.describe(), b.describe());
  std::int64_t ka = ta ? a.shape()[1] : a.shape()[2];
  std::int64_t kb = tb ? b.shape()[2] : b.shape()[1];
  KILN_CHECK(ka == kb && (a.shape()[0] == b.shape()[0]),
             "matmul: shapes {} and {} do not match for a product (inner sizes {} and {})", shape_str(a.shape()),
             shape_str(b.shape()), ka, kb);
  m = ta ? a.shape()[2] : a.shape()[1];
  n = tb ? b.shape()[1] : b.shape()[2];
}
}  // namespace

Tensor gemm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  std::int64_t m = 0, n = 0;
  check_gemm(a, b, trans_a, trans_b, m, n);
  Tensor out = Tensor::empty({a.shape()[0], m, n}, a.dtype(), a.device());
  if (out.numel()) KILN_KERNEL(a.device(), gemm)(a, b, out, trans_a, trans_b, 1.0, 0.0);
  return out;
}

void gemm_into(const Tensor& a, const Tensor& b, const Tensor& out, bool trans_a, bool trans_b, double alpha,
               double beta) {
  std::int64_t m = 0, n = 0;
  check_gemm(a, b, trans_a, trans_b, m, n);
  KILN_CHECK(out.dim() == 3 && out.shape()[0] == a.shape()[0] && out.shape()[1] == m && out.shape()[2] == n &&
                 out.is_contiguous() && out.device() == a.device(),
             "gemm: output {} does not match [{}, {}, {}] on {}", out.describe(), a.shape()[0], m, n, a.device().str());
  const bool widened = out.dtype() == DType::F32 && (a.dtype() == DType::BF16 || a.dtype() == DType::F16);
  KILN_CHECK(out.dtype() == a.dtype() || widened,
             "gemm: output {} must have the operands' dtype {} (or float32 for bf16/f16 operands)", out.describe(),
             dtype_name(a.dtype()));
  if (out.numel()) KILN_KERNEL(a.device(), gemm)(a, b, out, trans_a, trans_b, alpha, beta);
}

Tensor gemm_bias(const Tensor& a, const Tensor& b, const Tensor& bias, bool trans_a, bool trans_b) {
  std::int64_t m = 0, n = 0;
  check_gemm(a, b, trans_a, trans_b, m, n);
  check_compatible("linear", a, bias);
  KILN_CHECK(bias.dim() == 1 && bias.shape()[0] == n && bias.is_contiguous(),
             "gemm: bias {} does not match the {} output columns", bias.describe(), n);
  Tensor out = Tensor::empty({a.shape()[0], m, n}, a.dtype(), a.device());
  if (out.numel()) KILN_KERNEL(a.device(), gemm_bias)(a, b, bias, out, trans_a, trans_b);
  return out;
}

}  // namespace kiln::ops
