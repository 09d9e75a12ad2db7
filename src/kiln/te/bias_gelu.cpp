#include "kiln/te/bias_gelu.h"

#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te {

Tensor linear_bias_gelu(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in) {
  constexpr const char* op = "linear_bias_gelu";
  KILN_CHECK(x_in.defined() && w_in.defined(), "{}: x and w are required", op);
  KILN_CHECK(is_floating(x_in.dtype()) && x_in.dim() >= 1, "{}: x must be a floating [..., K] tensor, got {}", op,
             x_in.describe());
  KILN_CHECK(w_in.dim() == 2 && w_in.shape()[1] == x_in.shape().back() && w_in.dtype() == x_in.dtype() &&
                 w_in.device() == x_in.device(),
             "{}: w must be [O, K] with K = {} and x's dtype and device ({}), got {}", op, x_in.shape().back(),
             x_in.describe(), w_in.describe());
  if (b_in.defined())
    KILN_CHECK(b_in.dim() == 1 && b_in.shape()[0] == w_in.shape()[0] && b_in.dtype() == x_in.dtype() &&
                   b_in.device() == x_in.device(),
               "{}: b must be [{}] (w's rows) with x's dtype and device ({}), got {}", op, w_in.shape()[0],
               x_in.describe(), b_in.describe());
  const std::int64_t k = x_in.shape().back(), o = w_in.shape()[0], n = k > 0 ? x_in.numel() / k : 0;
  const Tensor x = ops::contiguous(x_in).reshape({n, k}), w = ops::contiguous(w_in),
               b = b_in.defined() ? ops::contiguous(b_in) : Tensor();
  Tensor y = Tensor::empty({n, o}, x.dtype(), x.device());
  Tensor pre = Tensor::empty({n, o}, x.dtype(), x.device());
  if (y.numel() > 0) ops::kernel(fused_ops().linear_bias_gelu_forward, x.device(), x.dtype())(x, w, b, y, pre);
  Shape out_shape = x_in.shape();
  out_shape.back() = o;
  y = y.view(out_shape);
  if (autograd::needs_grad({x_in, w_in, b_in})) {
    const bool gx = x_in.requires_grad(), gw = w_in.requires_grad(), gb = b_in.defined() && b_in.requires_grad();
    autograd::record("LinearBiasGeluBackward", {x_in, w_in, b_in}, {&y},
                     [sx = autograd::SavedTensor(x.detach()), sw = autograd::SavedTensor(w.detach()), pre,
                      x_shape = x_in.shape(), gx, gw, gb](const autograd::Grads& g) -> autograd::Grads {
                       if (!g[0].defined()) return {Tensor(), Tensor(), Tensor()};
                       const Tensor& xv = sx.get("linear_bias_gelu");
                       const Tensor& wv = sw.get("linear_bias_gelu");
                       const Tensor dy = ops::contiguous(g[0]).reshape(pre.shape());
                       Tensor dx = gx ? Tensor::empty(xv.shape(), xv.dtype(), xv.device()) : Tensor();
                       Tensor dw = gw ? Tensor::empty(wv.shape(), wv.dtype(), wv.device()) : Tensor();
                       Tensor db = gb ? Tensor::empty({wv.shape()[0]}, wv.dtype(), wv.device()) : Tensor();
                       if (pre.numel() > 0) {
                         ops::kernel(fused_ops().linear_bias_gelu_backward, xv.device(), xv.dtype())(dy, pre, xv, wv,
                                                                                                     dx, dw, db);
                       } else {
                         if (dx.defined()) dx.zero_();
                         if (dw.defined()) dw.zero_();
                         if (db.defined()) db.zero_();
                       }
                       return {dx.defined() ? dx.view(x_shape) : dx, dw, db};
                     });
  }
  return y;
}

}  // namespace kiln::te
