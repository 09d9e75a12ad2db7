#include "kiln/nn/layers.h"

#include <fmt/format.h>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/random_replay.h"
#include "kiln/nn/init.h"
#include "kiln/ops/elementwise.h"
#include "kiln/runtime/graph_capture_state.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::nn {

namespace {
const char* py_bool(bool b) { return b ? "True" : "False"; }
}  // namespace

// ---- Linear
Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool with_bias)
    : UnaryModule("Linear"), in_features(in_features), out_features(out_features) {
  KILN_CHECK(in_features >= 0 && out_features >= 0, "Linear: negative size ({}, {})", in_features, out_features);
  weight = register_parameter("weight", Tensor::empty({out_features, in_features}));
  bias = register_parameter("bias", with_bias ? Tensor::empty({out_features}) : Tensor());
  reset_parameters();
}

void Linear::reset_parameters() { init::default_linear_init(weight, bias); }

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features, out_features, py_bool(bias.defined()));
}

// ---- Conv2d
Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, int kernel_size, Conv2dOptions options)
    : UnaryModule("Conv2d"),
      in_channels(in_channels),
      out_channels(out_channels),
      kernel_size(kernel_size),
      options(options) {
  KILN_CHECK(options.groups > 0 && in_channels % options.groups == 0 && out_channels % options.groups == 0,
             "Conv2d: in_channels {} and out_channels {} must be divisible by groups {}", in_channels, out_channels,
             options.groups);
  KILN_CHECK(kernel_size > 0 && options.stride > 0 && options.dilation > 0 && options.padding >= 0,
             "Conv2d: invalid kernel_size {}, stride {}, padding {} or dilation {}", kernel_size, options.stride,
             options.padding, options.dilation);
  weight = register_parameter("weight",
                              Tensor::empty({out_channels, in_channels / options.groups, kernel_size, kernel_size}));
  bias = register_parameter("bias", options.bias ? Tensor::empty({out_channels}) : Tensor());
  reset_parameters();
}

void Conv2d::reset_parameters() { init::default_linear_init(weight, bias); }

ops::Conv2dParams Conv2d::params() const {
  ops::Conv2dParams p;
  p.stride_h = p.stride_w = options.stride;
  p.pad_h = p.pad_w = options.padding;
  p.dilation_h = p.dilation_w = options.dilation;
  p.groups = options.groups;
  return p;
}

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, params()); }

std::string Conv2d::extra_repr() const {
  std::string s = fmt::format("{}, {}, kernel_size=({}, {}), stride=({}, {})", in_channels, out_channels, kernel_size,
                              kernel_size, options.stride, options.stride);
  if (options.padding != 0) s += fmt::format(", padding=({}, {})", options.padding, options.padding);
  if (options.dilation != 1) s += fmt::format(", dilation=({}, {})", options.dilation, options.dilation);
  if (options.groups != 1) s += fmt::format(", groups={}", options.groups);
  if (!options.bias) s += ", bias=False";
  return s;
}

// ---- BatchNorm
BatchNorm::BatchNorm(std::string type_name, std::int64_t num_features, BatchNormOptions options, int min_dim,
                     int max_dim)
    : UnaryModule(std::move(type_name)),
      num_features(num_features),
      options(options),
      min_dim_(min_dim),
      max_dim_(max_dim) {
  weight = register_parameter("weight", options.affine ? Tensor::empty({num_features}) : Tensor());
  bias = register_parameter("bias", options.affine ? Tensor::empty({num_features}) : Tensor());
  if (options.track_running_stats) {
    running_mean = register_buffer("running_mean", Tensor::zeros({num_features}));
    running_var = register_buffer("running_var", Tensor::ones({num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", Tensor::zeros({}, DType::I64));
  }
  reset_parameters();
}

void BatchNorm::reset_running_stats() {
  if (!options.track_running_stats) return;
  init::zeros_(running_mean);
  init::ones_(running_var);
  init::zeros_(num_batches_tracked);
}

void BatchNorm::reset_parameters() {
  reset_running_stats();
  if (options.affine) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

Tensor BatchNorm::forward(const Tensor& x) { return forward_act(x, Tensor(), false); }

Tensor BatchNorm::forward_act(const Tensor& x, const Tensor& residual, bool relu) {
  KILN_CHECK(x.dim() >= min_dim_ && x.dim() <= max_dim_, "{}: expected a {}-D to {}-D input, got {}", type_name(),
             min_dim_, max_dim_, x.describe());
  KILN_CHECK(x.size(1) == num_features, "{}: input {} has {} channels, expected {}", type_name(), x.describe(),
             x.size(1), num_features);
  const bool batch_stats = is_training() || !options.track_running_stats;
  if (is_training() && options.track_running_stats) {
    NoGradGuard no_grad;
    ops::binary_(ops::BinaryOp::Add, num_batches_tracked, 1.0);
  }
  // [N, C, L] runs as [N, C, L, 1].
  const bool three_d = x.dim() == 3;
  const auto as_4d = [&](const Tensor& t) { return three_d && t.defined() ? t.unsqueeze(3) : t; };
  Tensor y = batch_norm_act(as_4d(x), weight, bias, running_mean, running_var, batch_stats, options.momentum,
                            options.eps, as_4d(residual), relu);
  return three_d ? y.squeeze(3) : y;
}

std::string BatchNorm::extra_repr() const {
  return fmt::format("{}, eps={}, momentum={}, affine={}, track_running_stats={}", num_features, options.eps,
                     options.momentum, py_bool(options.affine), py_bool(options.track_running_stats));
}

BatchNorm1d::BatchNorm1d(std::int64_t num_features, BatchNormOptions options)
    : BatchNorm("BatchNorm1d", num_features, options, 2, 3) {}

BatchNorm2d::BatchNorm2d(std::int64_t num_features, BatchNormOptions options)
    : BatchNorm("BatchNorm2d", num_features, options, 4, 4) {}

// ---- LayerNorm, RMSNorm
LayerNorm::LayerNorm(std::int64_t normalized_shape, double eps, bool elementwise_affine, bool with_bias)
    : UnaryModule("LayerNorm"), normalized_shape(normalized_shape), eps(eps), elementwise_affine(elementwise_affine) {
  weight = register_parameter("weight", elementwise_affine ? Tensor::ones({normalized_shape}) : Tensor());
  bias = register_parameter("bias", elementwise_affine && with_bias ? Tensor::zeros({normalized_shape}) : Tensor());
}

Tensor LayerNorm::forward(const Tensor& x) {
  KILN_CHECK(x.dim() >= 1 && x.shape().back() == normalized_shape,
             "LayerNorm: input {} does not end in the normalized size {}", x.describe(), normalized_shape);
  return layer_norm(x, weight, bias, eps);
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("({},), eps={}, elementwise_affine={}", normalized_shape, eps, py_bool(elementwise_affine));
}

RMSNorm::RMSNorm(std::int64_t normalized_shape, double eps)
    : UnaryModule("RMSNorm"), normalized_shape(normalized_shape), eps(eps) {
  weight = register_parameter("weight", Tensor::ones({normalized_shape}));
}

Tensor RMSNorm::forward(const Tensor& x) {
  KILN_CHECK(x.dim() >= 1 && x.shape().back() == normalized_shape,
             "RMSNorm: input {} does not end in the normalized size {}", x.describe(), normalized_shape);
  return rms_norm(x, weight, eps);
}

std::string RMSNorm::extra_repr() const {
  return fmt::format("({},), eps={}, elementwise_affine=True", normalized_shape, eps);
}

// ---- pooling
MaxPool2d::MaxPool2d(int kernel_size, int stride, int padding)
    : UnaryModule("MaxPool2d"), kernel_size(kernel_size), stride(stride < 0 ? kernel_size : stride), padding(padding) {}

Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, kernel_size, stride, padding); }

std::string MaxPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}, dilation=1, ceil_mode=False", kernel_size, stride,
                     padding);
}

AvgPool2d::AvgPool2d(int kernel_size, int stride, int padding, bool count_include_pad)
    : UnaryModule("AvgPool2d"),
      kernel_size(kernel_size),
      stride(stride < 0 ? kernel_size : stride),
      padding(padding),
      count_include_pad(count_include_pad) {}

Tensor AvgPool2d::forward(const Tensor& x) { return avg_pool2d(x, kernel_size, stride, padding, count_include_pad); }

std::string AvgPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}", kernel_size, stride, padding);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(int output_h, int output_w)
    : UnaryModule("AdaptiveAvgPool2d"), output_h(output_h), output_w(output_w) {}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptive_avg_pool2d(x, output_h, output_w); }

std::string AdaptiveAvgPool2d::extra_repr() const { return fmt::format("output_size=({}, {})", output_h, output_w); }

// ---- Dropout, Embedding
Dropout::Dropout(double p, std::optional<std::uint64_t> seed_opt)
    : UnaryModule("Dropout"), p(p), seed(seed_opt ? *seed_opt : default_generator().next_seed()) {
  KILN_CHECK(p >= 0 && p <= 1, "Dropout: probability must be in [0, 1], got {}", p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p == 0) return x;
  // Activation recompute: the first run's mask, and this module's position left as it is.
  if (std::optional<autograd::RandomDraw> d = autograd::replayed_random_draw())
    return d->device_offset.defined() ? dropout_advancing(x, p, d->seed, d->device_offset.clone())
                                      : dropout(x, p, true, d->seed, d->offset);
  const bool recording = autograd::recording_random_draws();
  if (graph_safe) {
    // (Re)start the device counter from `offset` when it is new, moved, or `offset` was assigned.
    if (!offset_counter_.defined() || offset_counter_.device() != x.device() || offset != counter_base_) {
      KILN_CHECK(!graph_capture_active(),
                 "Dropout: run one training forward eagerly before capturing it in a CUDA graph (its device "
                 "offset counter is created then), and do not assign its offset during capture");
      offset_counter_ = Tensor::scalar(static_cast<double>(offset), DType::I64, x.device());
    }
    if (recording) autograd::record_random_draw({seed, 0, offset_counter_.clone()});  // before it advances
    Tensor y = dropout_advancing(x, p, seed, offset_counter_);
    offset += static_cast<std::uint64_t>(x.numel());  // the host mirror, while running eagerly
    counter_base_ = offset;
    return y;
  }
  if (recording) autograd::record_random_draw({seed, offset, Tensor()});
  Tensor y = dropout(x, p, true, seed, offset);
  offset += static_cast<std::uint64_t>(x.numel());
  return y;
}

autograd::RandomDraw Dropout::reserve(std::int64_t count, Device device) {
  KILN_CHECK(is_training() && p > 0, "Dropout: reserve() draws a mask: call it in training with p > 0 (p = {})", p);
  KILN_CHECK(count >= 0, "Dropout: reserve() needs a non-negative element count, got {}", count);
  // The branches mirror forward()'s, so that a fused kernel and forward() draw the same masks.
  if (std::optional<autograd::RandomDraw> d = autograd::replayed_random_draw()) return *d;
  const bool recording = autograd::recording_random_draws();
  if (graph_safe) {
    if (!offset_counter_.defined() || offset_counter_.device() != device || offset != counter_base_) {
      KILN_CHECK(!graph_capture_active(),
                 "Dropout: run one training forward eagerly before capturing it in a CUDA graph (its device "
                 "offset counter is created then), and do not assign its offset during capture");
      offset_counter_ = Tensor::scalar(static_cast<double>(offset), DType::I64, device);
    }
    const autograd::RandomDraw draw{seed, 0, offset_counter_.clone()};  // before it advances
    if (recording) autograd::record_random_draw(draw);
    // Advance on the device, in stream order (exact below 2^53); the kernel reads the copy.
    ops::binary_(ops::BinaryOp::Add, offset_counter_, static_cast<double>(count));
    offset += static_cast<std::uint64_t>(count);
    counter_base_ = offset;
    return draw;
  }
  const autograd::RandomDraw draw{seed, offset, Tensor()};
  if (recording) autograd::record_random_draw(draw);
  offset += static_cast<std::uint64_t>(count);
  return draw;
}

void Dropout::sync_offset_from_device() {
  if (!offset_counter_.defined()) return;
  offset = static_cast<std::uint64_t>(offset_counter_.item());
  counter_base_ = offset;
}

std::string Dropout::extra_repr() const { return fmt::format("p={}, inplace=False", p); }

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim)
    : UnaryModule("Embedding"), num_embeddings(num_embeddings), embedding_dim(embedding_dim) {
  weight = register_parameter("weight", Tensor::empty({num_embeddings, embedding_dim}));
  init::normal_(weight);
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices); }

std::string Embedding::extra_repr() const { return fmt::format("{}, {}", num_embeddings, embedding_dim); }

// ---- activations
Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x, tanh_approximation); }
std::string GELU::extra_repr() const { return tanh_approximation ? "approximate='tanh'" : "approximate='none'"; }
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Tensor Tanh::forward(const Tensor& x) { return kiln::tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }
std::string Flatten::extra_repr() const { return fmt::format("start_dim={}, end_dim={}", start_dim, end_dim); }

}  // namespace kiln::nn
