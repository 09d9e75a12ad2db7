#include "kiln/ops/norm.h"

#include "kiln/ops/checks.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/kernels.h"
#include "kiln/ops/memory_format.h"

namespace kiln::ops {

namespace {

void check_param(const char* op, const Tensor& x, const Tensor& p, const char* name, std::int64_t size) {
  if (!p.defined()) return;
  check_same_device(op, x, p);
  KILN_CHECK(p.numel() == size, "{}: {} {} does not match {} (expected {} elements)", op, name, p.describe(),
             x.describe(), size);
}

Tensor contiguous_or_undefined(const Tensor& t) { return t.defined() ? contiguous(t) : t; }

// Batch-norm parameters and statistics: the input's dtype, or float32 with bf16/f16 input (mixed
// precision: autocast convolutions give bf16 activations while BatchNorm keeps f32 weight, bias
// and running statistics, as PyTorch's cuDNN batch norm accepts).
void check_bn_param_dtype(const Tensor& x, const Tensor& p) {
  if (!p.defined() || p.dtype() == x.dtype()) return;
  const bool low = x.dtype() == DType::BF16 || x.dtype() == DType::F16;
  KILN_CHECK(low && p.dtype() == DType::F32,
             "batch_norm: parameter {} must have the input's dtype, or float32 for a bfloat16/float16 input {}",
             p.describe(), x.describe());
}

// Normalisation statistics (batch norm's save_mean/save_invstd, layer/RMS norm's mean/rstd): f64
// for an f64 input, so f64 normalisation is f64 throughout; f32 otherwise.
DType statistics_dtype(const Tensor& x) { return x.dtype() == DType::F64 ? DType::F64 : DType::F32; }

}  // namespace

BatchNormResult batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, bool training, double momentum, double eps,
                           const BatchNormEpilogue& epilogue) {
  check_defined("batch_norm", x, "input");
  check_floating("batch_norm", x);
  KILN_CHECK(x.dim() >= 2, "batch_norm: input must be [N, C] or [N, C, ...], got {}", x.describe());
  const std::int64_t c = x.shape()[1];
  check_param("batch_norm", x, weight, "weight", c);
  check_param("batch_norm", x, bias, "bias", c);
  check_param("batch_norm", x, running_mean, "running_mean", c);
  check_param("batch_norm", x, running_var, "running_var", c);
  check_bn_param_dtype(x, weight);
  check_bn_param_dtype(x, bias);
  KILN_CHECK(running_mean.defined() == running_var.defined(),
             "batch_norm: running_mean and running_var must both be given or both be undefined");
  if (running_mean.defined())
    KILN_CHECK(running_mean.is_contiguous() && running_var.is_contiguous(),
               "batch_norm: running statistics must be contiguous (they are updated in place), got {} and {}",
               running_mean.describe(), running_var.describe());
  const Tensor& residual = epilogue.residual;
  if (residual.defined()) {
    check_compatible("batch_norm", residual, x);
    KILN_CHECK(residual.shape() == x.shape(), "batch_norm: residual {} does not match input {}", residual.describe(),
               x.describe());
  }
  const bool batch_stats = training || !running_mean.defined();
  if (batch_stats)
    KILN_CHECK(x.numel() / std::max<std::int64_t>(c, 1) > 1,
               "batch_norm: expected more than 1 value per channel when training, got input {}", x.describe());
  // A channels-last input stays channels-last where the device's kernels take it.
  const bool cl =
      kernel_has_flag(op::batch_norm_forward, x.device().kind, kTakesChannelsLast) && is_channels_last_only(x);
  BatchNormResult r;
  r.y = cl ? empty_channels_last(x.shape(), x.dtype(), x.device()) : empty_like(x);
  if (batch_stats) {
    r.save_mean = Tensor::empty({c}, statistics_dtype(x), x.device());
    r.save_invstd = Tensor::empty({c}, statistics_dtype(x), x.device());
  }
  if (x.numel() == 0) return r;
  KILN_KERNEL(x.device(), batch_norm_forward)
  (cl ? x : contiguous(x), contiguous_or_undefined(weight), contiguous_or_undefined(bias), running_mean, running_var,
   batch_stats, momentum, eps,
   !residual.defined() ? residual
   : cl                ? ops::to_channels_last(residual)
                       : contiguous(residual),
   epilogue.relu, r.y, r.save_mean, r.save_invstd);
  if (training && running_mean.defined()) {
    running_mean.storage()->bump_version();
    running_var.storage()->bump_version();
  }
  return r;
}

NormGrads batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                              const Tensor& save_invstd, bool need_x, bool need_w, bool need_b) {
  BatchNormEpilogueGrads g = batch_norm_epilogue_backward(grad_y, x, Tensor(), false, weight, save_mean, save_invstd,
                                                          need_x, need_w, need_b, false);
  return {g.x, g.w, g.b};
}

BatchNormEpilogueGrads batch_norm_epilogue_backward(const Tensor& grad_y, const Tensor& x, const Tensor& y, bool relu,
                                                    const Tensor& weight, const Tensor& save_mean,
                                                    const Tensor& save_invstd, bool need_x, bool need_w, bool need_b,
                                                    bool need_residual) {
  check_compatible("batch_norm_backward", grad_y, x);
  KILN_CHECK(grad_y.shape() == x.shape(), "batch_norm_backward: grad_output {} does not match input {}",
             grad_y.describe(), x.describe());
  if (relu) {
    check_compatible("batch_norm_backward", y, x);
    KILN_CHECK(y.shape() == x.shape(), "batch_norm_backward: the forward's output {} does not match input {}",
               y.describe(), x.describe());
  }
  const std::int64_t c = x.shape()[1];
  const bool cl =
      kernel_has_flag(op::batch_norm_forward, x.device().kind, kTakesChannelsLast) && is_channels_last_only(x);
  BatchNormEpilogueGrads g;
  const auto like_x = [&] { return cl ? empty_channels_last(x.shape(), x.dtype(), x.device()) : empty_like(x); };
  if (need_x) g.x = like_x();
  // Without the ReLU the residual's gradient is grad_y itself; with it, the kernel writes the masked one.
  if (need_residual) g.residual = relu ? like_x() : grad_y;
  // Parameter gradients in the parameters' dtype (f32 weight with a bf16 input gives f32 grads);
  // weight and bias share a dtype in practice (the autograd function converts otherwise).
  const DType pt = weight.defined() ? weight.dtype() : x.dtype();
  if (need_w) g.w = Tensor::empty({c}, pt, x.device());
  if (need_b) g.b = Tensor::empty({c}, pt, x.device());
  if (x.numel() == 0) {
    for (Tensor* t : {&g.x, &g.w, &g.b})
      if (t->defined()) fill(*t, 0.0);
    return g;
  }
  const auto in_layout = [&](const Tensor& t) { return cl ? ops::to_channels_last(t) : contiguous(t); };
  KILN_KERNEL(x.device(), batch_norm_backward)
  (in_layout(grad_y), cl ? x : contiguous(x), relu ? in_layout(y) : Tensor(), relu, contiguous_or_undefined(weight),
   contiguous(save_mean), contiguous(save_invstd), g.x, g.w, g.b, relu ? g.residual : Tensor());
  return g;
}

namespace {
std::int64_t normalized_size(const char* op, const Tensor& x, const Tensor& weight) {
  KILN_CHECK(x.dim() >= 1, "{}: input must have at least one dimension, got {}", op, x.describe());
  if (!weight.defined()) return x.shape().back();
  const std::int64_t wd = weight.dim();
  bool ok = wd >= 1 && wd <= x.dim();
  for (std::int64_t i = 0; ok && i < wd; ++i) ok = weight.shape()[i] == x.shape()[x.dim() - wd + i];
  KILN_CHECK(ok, "{}: weight {} does not match the trailing dimensions of input {}", op, weight.describe(),
             x.describe());
  return weight.numel();
}
}  // namespace

LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_defined("layer_norm", x, "input");
  check_floating("layer_norm", x);
  const std::int64_t d = normalized_size("layer_norm", x, weight);
  check_param("layer_norm", x, bias, "bias", d);
  if (weight.defined()) check_same_dtype("layer_norm", x, weight);
  if (bias.defined()) check_same_dtype("layer_norm", x, bias);
  const std::int64_t rows = d ? x.numel() / d : 0;
  LayerNormResult r{empty_like(x), Tensor::empty({rows}, statistics_dtype(x), x.device()),
                    Tensor::empty({rows}, statistics_dtype(x), x.device())};
  if (x.numel() == 0) return r;
  KILN_KERNEL(x.device(), layer_norm_forward)
  (contiguous(x), contiguous_or_undefined(weight), contiguous_or_undefined(bias), eps, r.y, r.mean, r.rstd);
  return r;
}

NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, bool need_x, bool need_w, bool need_b) {
  check_compatible("layer_norm_backward", grad_y, x);
  NormGrads g;
  if (need_x) g.x = empty_like(x);
  if (need_w && weight.defined()) g.w = empty_like(weight);
  if (need_b && weight.defined()) g.b = empty_like(weight);
  if (need_b && !weight.defined()) g.b = Tensor::empty({x.shape().back()}, x.dtype(), x.device());
  if (x.numel() == 0) {
    for (Tensor* t : {&g.x, &g.w, &g.b})
      if (t->defined()) fill(*t, 0.0);
    return g;
  }
  KILN_KERNEL(x.device(), layer_norm_backward)
  (contiguous(grad_y), contiguous(x), contiguous_or_undefined(weight), mean, rstd, g.x, g.w, g.b);
  return g;
}

LayerNormResult rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_defined("rms_norm", x, "input");
  check_floating("rms_norm", x);
  const std::int64_t d = normalized_size("rms_norm", x, weight);
  if (weight.defined()) check_same_dtype("rms_norm", x, weight);
  const std::int64_t rows = d ? x.numel() / d : 0;
  LayerNormResult r{empty_like(x), Tensor(), Tensor::empty({rows}, statistics_dtype(x), x.device())};
  if (x.numel() == 0) return r;
  KILN_KERNEL(x.device(), rms_norm_forward)(contiguous(x), contiguous_or_undefined(weight), eps, r.y, r.rstd);
  return r;
}

NormGrads rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                            bool need_x, bool need_w) {
  check_compatible("rms_norm_backward", grad_y, x);
  NormGrads g;
  if (need_x) g.x = empty_like(x);
  if (need_w && weight.defined()) g.w = empty_like(weight);
  if (x.numel() == 0) {
    for (Tensor* t : {&g.x, &g.w})
      if (t->defined()) fill(*t, 0.0);
    return g;
  }
  KILN_KERNEL(x.device(), rms_norm_backward)
  (contiguous(grad_y), contiguous(x), contiguous_or_undefined(weight), rstd, g.x, g.w);
  return g;
}

}  // namespace kiln::ops
