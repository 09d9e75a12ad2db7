#include "kiln/te/swiglu.h"

#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te {

namespace {

Tensor swiglu_impl(const Tensor& x_in, const Fp8Tensor* out8) {
  KILN_CHECK(x_in.defined() && is_floating(x_in.dtype()) && x_in.dim() >= 1 && x_in.shape().back() % 2 == 0,
             "swiglu: x must be a floating tensor [..., 2F] (gate | up), got {}",
             x_in.defined() ? x_in.describe() : "undefined");
  const Tensor x = ops::contiguous(x_in);
  Shape out_shape = x.shape();
  out_shape.back() /= 2;
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  if (out8) {
    const std::int64_t f = out_shape.back(), rows = f ? y.numel() / f : 0;
    out8->check("swiglu_fp8", "out8");
    KILN_CHECK(out8->layout == ScalingLayout::PerTensor && out8->rows() == rows && out8->cols() == f &&
                   out8->device() == x.device() && x.dtype() != DType::F64,
               "swiglu_fp8: out8 must be a per-tensor [{}, {}] fp8 tensor on {} and x float32/bfloat16/float16 (x {}, "
               "out8 {} {})",
               rows, f, x.device().str(), x.describe(), scaling_layout_name(out8->layout),
               shape_str(out8->data.shape()));
    if (y.numel() > 0) ops::kernel(fused_ops().swiglu_fp8_forward, x.device(), x.dtype())(x, *out8);
  } else if (y.numel() > 0) {
    ops::kernel(fused_ops().swiglu_forward, x.device(), x.dtype())(x, y);
  }
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

}  // namespace

Tensor swiglu(const Tensor& x) { return swiglu_impl(x, nullptr); }
Tensor swiglu_fp8(const Tensor& x, const Fp8Tensor& out8) { return swiglu_impl(x, &out8); }

}  // namespace kiln::te
