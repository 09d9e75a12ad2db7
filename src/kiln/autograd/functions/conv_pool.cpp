// Differentiable conv2d and pooling (NCHW). The backward kernels are the ops::*_backward wrappers.
#include "kiln/ops/conv_pool.h"

#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/memory_format.h"
#include "kiln/tensor/autocast.h"

namespace kiln {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;

Tensor conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, ops::Conv2dParams p) {
  // Under autocast the convolution runs in the autocast dtype; the casts are differentiable, so
  // fp32 parameters receive fp32 gradients (they are the master weights).
  const Tensor x = autocast_input(x_in), weight = autocast_input(weight_in), bias = autocast_input(bias_in);
  if (x.defined() && x.dim() == 3)
    return kiln::conv2d(x.unsqueeze(0), weight, bias, p).squeeze(0);  // unbatched [C, H, W]
  // A channels-last run takes the weight laid out channels-last: lay it out once, here, and save that
  // copy, so the backward's data gradient does not lay the weight out again.
  const Tensor run_weight =
      weight.defined() && x.defined() && ops::conv2d_runs_channels_last(x) ? ops::to_channels_last(weight) : weight;
  Tensor y = ops::conv2d(x, run_weight, bias, p);
  if (needs_grad({x, weight, bias})) {
    record("Conv2dBackward", {x, weight, bias}, {&y},
           [sx = SavedTensor(x.detach()), sw = SavedTensor(run_weight.detach()), p, gx = x.requires_grad(),
            gw = weight.requires_grad(), gb = bias.defined() && bias.requires_grad()](const Grads& g) -> Grads {
             if (!g[0].defined()) return {Tensor(), Tensor(), Tensor()};
             auto r = ops::conv2d_backward(g[0], sx.get("conv2d"), sw.get("conv2d"), p, gx, gw, gb);
             return {r.x, r.w, r.b};
           });
  }
  return y;
}

namespace {
ops::Pool2dParams square_pool(const char* op, int kernel, int stride, int padding) {
  KILN_CHECK(kernel > 0, "{}: kernel size must be positive, got {}", op, kernel);
  if (stride <= 0) stride = kernel;
  ops::Pool2dParams p;
  p.kernel_h = p.kernel_w = kernel;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = padding;
  return p;
}
}  // namespace

Tensor max_pool2d(const Tensor& x, int kernel, int stride, int padding) {
  const ops::Pool2dParams p = square_pool("max_pool2d", kernel, stride, padding);
  auto [y, indices] = ops::max_pool2d(x, p);
  if (needs_grad({x})) {
    record("MaxPool2dBackward", {x}, {&y}, [indices, shape = x.shape(), dtype = x.dtype(), p](const Grads& g) -> Grads {
      if (!g[0].defined()) return {Tensor()};
      return {ops::max_pool2d_backward(g[0], indices, shape, dtype, p)};
    });
  }
  return y;
}

Tensor avg_pool2d(const Tensor& x, int kernel, int stride, int padding, bool count_include_pad) {
  ops::Pool2dParams p = square_pool("avg_pool2d", kernel, stride, padding);
  p.count_include_pad = count_include_pad;
  Tensor y = ops::avg_pool2d(x, p);
  if (needs_grad({x})) {
    record("AvgPool2dBackward", {x}, {&y}, [shape = x.shape(), p](const Grads& g) -> Grads {
      if (!g[0].defined()) return {Tensor()};
      return {ops::avg_pool2d_backward(g[0], shape, p)};
    });
  }
  return y;
}

Tensor adaptive_avg_pool2d(const Tensor& x, int out_h, int out_w) {
  Tensor y = ops::adaptive_avg_pool2d(x, out_h, out_w);
  if (needs_grad({x})) {
    record("AdaptiveAvgPool2dBackward", {x}, {&y},
           [shape = x.shape(), cl = ops::adaptive_avg_pool2d_runs_channels_last(x)](const Grads& g) -> Grads {
             if (!g[0].defined()) return {Tensor()};
             return {ops::adaptive_avg_pool2d_backward(g[0], shape, cl)};
           });
  }
  return y;
}

}  // namespace kiln
