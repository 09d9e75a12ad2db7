#include "kiln/ops/conv_pool.h"

#include "kiln/ops/checks.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/kernels.h"
#include "kiln/ops/memory_format.h"

namespace kiln::ops {

std::int64_t conv_output_size(const char* op, std::int64_t in, std::int64_t kernel, int stride, int pad, int dilation) {
  const std::int64_t span = static_cast<std::int64_t>(dilation) * (kernel - 1) + 1;
  const std::int64_t out = (in + 2 * static_cast<std::int64_t>(pad) - span) / stride + 1;
  KILN_CHECK(in + 2 * static_cast<std::int64_t>(pad) >= span && out > 0,
             "{}: input size {} (padded by {} on each side) is smaller than the window {} (kernel {}, dilation {})", op,
             in, pad, span, kernel, dilation);
  return out;
}

namespace {

void check_conv(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  check_defined("conv2d", x, "input");
  check_defined("conv2d", w, "weight");
  check_compatible("conv2d", x, w);
  check_floating("conv2d", x);
  check_dim("conv2d", x, 4, "input [N, C, H, W]");
  check_dim("conv2d", w, 4, "weight [OC, C/groups, KH, KW]");
  KILN_CHECK(p.stride_h > 0 && p.stride_w > 0 && p.dilation_h > 0 && p.dilation_w > 0 && p.pad_h >= 0 && p.pad_w >= 0 &&
                 p.groups > 0,
             "conv2d: invalid parameters stride ({}, {}), padding ({}, {}), dilation ({}, {}), groups {}", p.stride_h,
             p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w, p.groups);
  KILN_CHECK(x.shape()[1] % p.groups == 0 && w.shape()[0] % p.groups == 0,
             "conv2d: groups {} must divide the input channels ({}) and the output channels ({})", p.groups,
             x.shape()[1], w.shape()[0]);
  KILN_CHECK(w.shape()[1] * p.groups == x.shape()[1],
             "conv2d: weight {} expects {} input channels ({} per group x {} groups), but input is {}", w.describe(),
             w.shape()[1] * p.groups, w.shape()[1], p.groups, x.describe());
  if (bias.defined()) {
    check_compatible("conv2d", x, bias);
    KILN_CHECK(bias.dim() == 1 && bias.shape()[0] == w.shape()[0], "conv2d: bias {} does not match weight {}",
               bias.describe(), w.describe());
  }
}

Shape conv_out_shape(const Tensor& x, const Tensor& w, const Conv2dParams& p) {
  return {x.shape()[0], w.shape()[0],
          conv_output_size("conv2d", x.shape()[2], w.shape()[2], p.stride_h, p.pad_h, p.dilation_h),
          conv_output_size("conv2d", x.shape()[3], w.shape()[3], p.stride_w, p.pad_w, p.dilation_w)};
}

void check_pool(const char* op, const Tensor& x, const Pool2dParams& p) {
  check_defined(op, x, "input");
  check_floating(op, x);
  KILN_CHECK(x.dim() == 4 || x.dim() == 3, "{}: input must be [N, C, H, W] or [C, H, W], got {}", op, x.describe());
  KILN_CHECK(p.kernel_h > 0 && p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_h >= 0 && p.pad_w >= 0,
             "{}: invalid parameters kernel ({}, {}), stride ({}, {}), padding ({}, {})", op, p.kernel_h, p.kernel_w,
             p.stride_h, p.stride_w, p.pad_h, p.pad_w);
  KILN_CHECK(p.pad_h <= p.kernel_h / 2 && p.pad_w <= p.kernel_w / 2,
             "{}: padding ({}, {}) must be at most half the kernel size ({}, {})", op, p.pad_h, p.pad_w, p.kernel_h,
             p.kernel_w);
}

Shape pool_out_shape(const char* op, const Tensor& x, const Pool2dParams& p) {
  Shape s = x.shape();
  const std::size_t nd = s.size();
  s[nd - 2] = conv_output_size(op, s[nd - 2], p.kernel_h, p.stride_h, p.pad_h, 1);
  s[nd - 1] = conv_output_size(op, s[nd - 1], p.kernel_w, p.stride_w, p.pad_w, 1);
  return s;
}

void check_grad(const char* op, const Tensor& grad_y, const Shape& expected) {
  check_defined(op, grad_y, "grad_output");
  KILN_CHECK(grad_y.shape() == expected, "{}: grad_output {} does not match the output shape {}", op, grad_y.describe(),
             shape_str(expected));
}

}  // namespace

// A channels-last input runs channels-last where the device's kernels can (cuDNN's tensor-core
// engines consume NHWC without transposes): the weight is laid out to match (a small copy) and
// the output is channels-last too; the weight gradient is returned contiguous, as the parameter.
bool conv2d_runs_channels_last(const Tensor& x) {
  return kernel_has_flag(op::conv2d_forward, x.device().kind, kTakesChannelsLast) && is_channels_last_only(x);
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  check_conv(x, w, bias, p);
  const bool cl = conv2d_runs_channels_last(x);
  const Shape out_shape = conv_out_shape(x, w, p);
  Tensor y =
      cl ? empty_channels_last(out_shape, x.dtype(), x.device()) : Tensor::empty(out_shape, x.dtype(), x.device());
  if (y.numel() == 0) return y;
  const Tensor b = bias.defined() ? contiguous(bias) : bias;
  if (cl)
    KILN_KERNEL(x.device(), conv2d_forward)(x, ops::to_channels_last(w), b, y, p);
  else
    KILN_KERNEL(x.device(), conv2d_forward)(contiguous(x), contiguous(w), b, y, p);
  return y;
}

Conv2dGrads conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Conv2dParams& p, bool need_x,
                            bool need_w, bool need_b) {
  check_conv(x, w, Tensor(), p);
  check_grad("conv2d_backward", grad_y, conv_out_shape(x, w, p));
  check_compatible("conv2d_backward", grad_y, x);
  Conv2dGrads g;
  const bool cl = conv2d_runs_channels_last(x) && x.numel() && grad_y.numel();
  if (need_x)
    g.x = cl ? empty_channels_last(x.shape(), x.dtype(), x.device()) : Tensor::empty(x.shape(), x.dtype(), x.device());
  if (need_w)
    g.w = cl ? empty_channels_last(w.shape(), w.dtype(), w.device()) : Tensor::empty(w.shape(), w.dtype(), w.device());
  if (need_b) g.b = Tensor::empty({w.shape()[0]}, w.dtype(), w.device());
  if (grad_y.numel() == 0 || x.numel() == 0) {
    for (Tensor* t : {&g.x, &g.w, &g.b})
      if (t->defined()) fill(*t, 0.0);
    return g;
  }
  if (cl) {
    KILN_KERNEL(x.device(), conv2d_backward)
    (ops::to_channels_last(grad_y), x, ops::to_channels_last(w), g.x, g.w, g.b, p);
    if (g.w.defined()) g.w = contiguous(g.w);
  } else if (need_x || need_w || need_b) {
    KILN_KERNEL(x.device(), conv2d_backward)(contiguous(grad_y), contiguous(x), contiguous(w), g.x, g.w, g.b, p);
  }
  return g;
}

std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dParams& p) {
  check_pool("max_pool2d", x, p);
  Shape s = pool_out_shape("max_pool2d", x, p);
  Tensor y = Tensor::empty(s, x.dtype(), x.device());
  Tensor idx = Tensor::empty(s, DType::I64, x.device());
  if (y.numel()) KILN_KERNEL(x.device(), max_pool2d_forward)(contiguous(x), y, idx, p);
  return {y, idx};
}

Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& indices, const Shape& x_shape, DType dtype,
                           const Pool2dParams& p) {
  check_grad("max_pool2d_backward", grad_y, indices.shape());
  check_same_device("max_pool2d_backward", grad_y, indices);
  Tensor gx = Tensor::empty(x_shape, dtype, grad_y.device());
  if (gx.numel() == 0) return gx;
  if (grad_y.numel() == 0) {
    fill(gx, 0.0);
    return gx;
  }
  KILN_KERNEL(gx.device(), max_pool2d_backward)
  (contiguous(to(grad_y, grad_y.device(), dtype)), contiguous(indices), gx, p);
  return gx;
}

Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p) {
  check_pool("avg_pool2d", x, p);
  Tensor y = Tensor::empty(pool_out_shape("avg_pool2d", x, p), x.dtype(), x.device());
  if (y.numel()) KILN_KERNEL(x.device(), avg_pool2d_forward)(contiguous(x), y, p);
  return y;
}

Tensor avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape, const Pool2dParams& p) {
  Tensor gx = Tensor::empty(x_shape, grad_y.dtype(), grad_y.device());
  if (gx.numel() == 0) return gx;
  if (grad_y.numel() == 0) {
    fill(gx, 0.0);
    return gx;
  }
  KILN_KERNEL(gx.device(), avg_pool2d_backward)(contiguous(grad_y), gx, p);
  return gx;
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::int64_t out_h, std::int64_t out_w) {
  check_defined("adaptive_avg_pool2d", x, "input");
  check_floating("adaptive_avg_pool2d", x);
  KILN_CHECK(x.dim() == 4 || x.dim() == 3, "adaptive_avg_pool2d: input must be [N, C, H, W] or [C, H, W], got {}",
             x.describe());
  KILN_CHECK(out_h > 0 && out_w > 0, "adaptive_avg_pool2d: output size ({}, {}) must be positive", out_h, out_w);
  Shape s = x.shape();
  KILN_CHECK(s[s.size() - 2] > 0 && s[s.size() - 1] > 0, "adaptive_avg_pool2d: input {} has an empty plane",
             x.describe());
  s[s.size() - 2] = out_h;
  s[s.size() - 1] = out_w;
  const bool cl = adaptive_avg_pool2d_runs_channels_last(x);
  Tensor y = cl ? empty_channels_last(s, x.dtype(), x.device()) : Tensor::empty(s, x.dtype(), x.device());
  if (y.numel()) KILN_KERNEL(x.device(), adaptive_avg_pool2d_forward)(cl ? x : contiguous(x), y);
  return y;
}

bool adaptive_avg_pool2d_runs_channels_last(const Tensor& x) {
  return x.dim() == 4 && kernel_has_flag(op::adaptive_avg_pool2d_forward, x.device().kind, kTakesChannelsLast) &&
         is_channels_last_only(x);
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape, bool channels_last) {
  Tensor gx = channels_last ? empty_channels_last(x_shape, grad_y.dtype(), grad_y.device())
                            : Tensor::empty(x_shape, grad_y.dtype(), grad_y.device());
  if (gx.numel() == 0) return gx;
  KILN_KERNEL(gx.device(), adaptive_avg_pool2d_backward)
  (channels_last ? ops::to_channels_last(grad_y) : contiguous(grad_y), gx);
  return gx;
}

}  // namespace kiln::ops
