#include "kiln/te/swiglu.h"

#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te {

Tensor swiglu(const Tensor& x_in) {
  KILN_CHECK(x_in.defined() && is_floating(x_in.dtype()) && x_in.dim() >= 1 && x_in.shape().back() % 2 == 0,
             "swiglu: x must be a floating tensor [..., 2F] (gate | up), got {}",
             x_in.defined() ? x_in.describe() : "undefined");
  const Tensor x = ops::contiguous(x_in);
  Shape out_shape = x.shape();
  out_shape.back() /= 2;
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  if (y.numel() > 0) ops::kernel(fused_ops().swiglu_forward, x.device(), x.dtype())(x, y);
  if (autograd::needs_grad({x_in}))
    autograd::record("SwigluBackward", {x_in}, {&y},
                     [sx = autograd::SavedTensor(x.detach())](const autograd::Grads& g) -> autograd::Grads {
                       if (!g[0].defined()) return {Tensor()};
                       const Tensor& xv = sx.get("swiglu");
                       Tensor dx = Tensor::empty(xv.shape(), xv.dtype(), xv.device());
                       if (dx.numel() > 0)
                         ops::kernel(fused_ops().swiglu_backward, xv.device(), xv.dtype())(ops::contiguous(g[0]), xv,
                                                                                           dx);
                       return {dx};
                     });
  return y;
}

}  // namespace kiln::te
