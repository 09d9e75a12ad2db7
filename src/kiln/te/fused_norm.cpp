#include "kiln/te/fused_norm.h"

#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te {

using autograd::Grads;
using autograd::SavedTensor;

namespace {

DType stat_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

void check_param(const char* op, const Tensor& x, const Tensor& p, const char* name) {
  if (!p.defined()) return;
  KILN_CHECK(p.device() == x.device(), "{}: {} is on {} but x on {}", op, name, p.device().str(), x.device().str());
  KILN_CHECK(p.dim() == 1 && p.shape()[0] == x.shape().back(), "{}: {} must be [{}] (x's last dimension), got {}", op,
             name, x.shape().back(), p.describe());
  KILN_CHECK(p.dtype() == x.dtype() || p.dtype() == DType::F32, "{}: {} must be {} (x's dtype) or float32, got {}", op,
             name, dtype_name(x.dtype()), p.describe());
}

void check_inputs(const char* op, const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b,
                  double eps) {
  KILN_CHECK(x.defined(), "{}: x is undefined", op);
  KILN_CHECK(is_floating(x.dtype()) && x.dim() >= 1 && x.shape().back() > 0,
             "{}: x must be a floating tensor [..., H] with H > 0, got {}", op, x.describe());
  if (residual.defined())
    KILN_CHECK(residual.shape() == x.shape() && residual.dtype() == x.dtype() && residual.device() == x.device(),
               "{}: residual must match x ({}), got {}", op, x.describe(), residual.describe());
  check_param(op, x, w, "weight");
  check_param(op, x, b, "bias");
  KILN_CHECK(eps > 0, "{}: eps must be positive, got {}", op, eps);
}

Tensor contiguous_or_undefined(const Tensor& t) { return t.defined() ? ops::contiguous(t) : t; }

// The gradient of a norm parameter in the parameter's own dtype, or undefined.
Tensor param_grad(const Tensor& p, bool wanted) {
  return wanted ? Tensor::empty(p.shape(), p.dtype(), p.device()) : Tensor();
}

}  // namespace

namespace {

void check_fp8_output(const char* op, const Tensor& x, const Fp8Tensor& y8) {
  y8.check(op, "y8");
  const std::int64_t cols = x.shape().back(), rows = cols ? x.numel() / cols : 0;
  KILN_CHECK(y8.layout == ScalingLayout::PerTensor && y8.rows() == rows && y8.cols() == cols,
             "{}: y8 must be a per-tensor [{}, {}] fp8 tensor (x {} flattened), got {} {}", op, rows, cols,
             x.describe(), scaling_layout_name(y8.layout), shape_str(y8.data.shape()));
  KILN_CHECK(y8.device() == x.device(), "{}: y8 is on {} but x on {}", op, y8.device().str(), x.device().str());
  KILN_CHECK(x.dtype() != DType::F64, "{}: the FP8 output form takes float32, bfloat16 or float16 data, got {}", op,
             x.describe());
}

// The forward of add_rms_norm; with y8 the output goes to its FP8 cast and the returned y is an
// unwritten placeholder (see add_rms_norm_fp8).
std::pair<Tensor, Tensor> rms_norm_impl(const Tensor& x_in, const Tensor& residual_in, const Tensor& w_in, double eps,
                                        const Fp8Tensor* y8) {
  check_inputs("add_rms_norm", x_in, residual_in, w_in, Tensor(), eps);
  if (y8) check_fp8_output("add_rms_norm_fp8", x_in, *y8);
  const Tensor x = ops::contiguous(x_in), residual = contiguous_or_undefined(residual_in),
               w = contiguous_or_undefined(w_in);
  const std::int64_t cols = x.shape().back(), rows = x.numel() / cols;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor s = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor rstd = Tensor::empty({rows}, stat_dtype(x.dtype()), x.device());
  if (rows > 0 && y8)
    ops::kernel(fused_ops().add_rms_norm_fp8_forward, x.device(), x.dtype())(x, residual, w, eps, *y8, s, rstd);
  else if (rows > 0)
    ops::kernel(fused_ops().add_rms_norm_forward, x.device(), x.dtype())(x, residual, w, eps, y, s, rstd);
  if (autograd::needs_grad({x_in, residual_in, w_in})) {
    const bool gx = x_in.requires_grad() || (residual_in.defined() && residual_in.requires_grad());
    const bool gw = w_in.defined() && w_in.requires_grad();
    autograd::record("AddRmsNormBackward", {x_in, residual_in, w_in}, {&y, &s},
                     [ss = SavedTensor(s.detach()), sw = SavedTensor(w.defined() ? w.detach() : Tensor()), rstd, gx,
                      gw](const Grads& g) -> Grads {
                       if (!g[0].defined() && !g[1].defined()) return {Tensor(), Tensor(), Tensor()};
                       const Tensor& sum = ss.get("add_rms_norm");
                       const Tensor wv = sw.defined() ? sw.get("add_rms_norm") : Tensor();
                       const Tensor dsum = g[1].defined() ? ops::contiguous(g[1]) : Tensor();
                       if (!g[0].defined()) return {dsum, dsum, Tensor()};  // only the sum reached the loss
                       const Tensor dy = ops::contiguous(g[0]);
                       Tensor dx = gx ? Tensor::empty(sum.shape(), sum.dtype(), sum.device()) : Tensor();
                       Tensor dw = param_grad(wv, gw);
                       if (rstd.numel() > 0)
                         ops::kernel(fused_ops().add_rms_norm_backward, sum.device(), sum.dtype())(dy, dsum, sum, wv,
                                                                                                   rstd, dx, dw);
                       else if (dw.defined())
                         dw.zero_();
                       return {dx, dx, dw};
                     });
  }
  return {y, s};
}

std::pair<Tensor, Tensor> layer_norm_impl(const Tensor& x_in, const Tensor& residual_in, const Tensor& w_in,
                                          const Tensor& b_in, double eps, const Fp8Tensor* y8) {
  check_inputs("add_layer_norm", x_in, residual_in, w_in, b_in, eps);
  if (y8) check_fp8_output("add_layer_norm_fp8", x_in, *y8);
  const Tensor x = ops::contiguous(x_in), residual = contiguous_or_undefined(residual_in),
               w = contiguous_or_undefined(w_in), b = contiguous_or_undefined(b_in);
  const std::int64_t cols = x.shape().back(), rows = x.numel() / cols;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor s = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty({rows}, stat_dtype(x.dtype()), x.device());
  Tensor rstd = Tensor::empty({rows}, stat_dtype(x.dtype()), x.device());
  if (rows > 0 && y8)
    ops::kernel(fused_ops().add_layer_norm_fp8_forward, x.device(), x.dtype())(x, residual, w, b, eps, *y8, s, mean,
                                                                               rstd);
  else if (rows > 0)
    ops::kernel(fused_ops().add_layer_norm_forward, x.device(), x.dtype())(x, residual, w, b, eps, y, s, mean, rstd);
  if (autograd::needs_grad({x_in, residual_in, w_in, b_in})) {
    const bool gx = x_in.requires_grad() || (residual_in.defined() && residual_in.requires_grad());
    const bool gw = w_in.defined() && w_in.requires_grad(), gb = b_in.defined() && b_in.requires_grad();
    autograd::record("AddLayerNormBackward", {x_in, residual_in, w_in, b_in}, {&y, &s},
                     [ss = SavedTensor(s.detach()), sw = SavedTensor(w.defined() ? w.detach() : Tensor()),
                      bias_dtype = b.defined() ? b.dtype() : x.dtype(), bias_shape = b.defined() ? b.shape() : Shape{},
                      mean, rstd, gx, gw, gb](const Grads& g) -> Grads {
                       if (!g[0].defined() && !g[1].defined()) return {Tensor(), Tensor(), Tensor(), Tensor()};
                       const Tensor& sum = ss.get("add_layer_norm");
                       const Tensor wv = sw.defined() ? sw.get("add_layer_norm") : Tensor();
                       const Tensor dsum = g[1].defined() ? ops::contiguous(g[1]) : Tensor();
                       if (!g[0].defined()) return {dsum, dsum, Tensor(), Tensor()};
                       const Tensor dy = ops::contiguous(g[0]);
                       Tensor dx = gx ? Tensor::empty(sum.shape(), sum.dtype(), sum.device()) : Tensor();
                       Tensor dw = param_grad(wv, gw);
                       Tensor db = gb ? Tensor::empty(bias_shape, bias_dtype, sum.device()) : Tensor();
                       if (rstd.numel() > 0) {
                         ops::kernel(fused_ops().add_layer_norm_backward, sum.device(), sum.dtype())(
                             dy, dsum, sum, wv, mean, rstd, dx, dw, db);
                       } else {
                         if (dw.defined()) dw.zero_();
                         if (db.defined()) db.zero_();
                       }
                       return {dx, dx, dw, db};
                     });
  }
  return {y, s};
}

}  // namespace

std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, double eps) {
  return rms_norm_impl(x, residual, w, eps, nullptr);
}

std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b,
                                         double eps) {
  return layer_norm_impl(x, residual, w, b, eps, nullptr);
}

std::pair<Tensor, Tensor> add_rms_norm_fp8(const Tensor& x, const Tensor& residual, const Tensor& w, double eps,
                                           const Fp8Tensor& y8) {
  return rms_norm_impl(x, residual, w, eps, &y8);
}

std::pair<Tensor, Tensor> add_layer_norm_fp8(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b,
                                             double eps, const Fp8Tensor& y8) {
  return layer_norm_impl(x, residual, w, b, eps, &y8);
}

}  // namespace kiln::te
