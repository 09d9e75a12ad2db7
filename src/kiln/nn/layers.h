#pragma once
// The standard layers (torch.nn names and defaults). Parameters are public members; each layer's
// forward() calls the differentiable function of the same name in autograd/functions.h.
// Parameters are created on the CPU in float32 with PyTorch's default initialisation, drawn
// from kiln::default_generator(); move and convert with module->to(...).
#include <cstdint>
#include <optional>
#include <string>

#include "kiln/autograd/random_replay.h"
#include "kiln/nn/module.h"
#include "kiln/ops/op_kinds.h"

namespace kiln::nn {

// y = x W^T + b; weight [out_features, in_features], bias [out_features].
class Linear : public UnaryModule {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  void reset_parameters();  // PyTorch's default init
  std::string extra_repr() const override;

  std::int64_t in_features, out_features;
  Tensor weight, bias;  // bias undefined when bias=false
};

struct Conv2dOptions {
  int stride = 1;
  int padding = 0;
  int dilation = 1;
  int groups = 1;
  bool bias = true;
};

// NCHW convolution with a square kernel; weight [out, in / groups, k, k].
class Conv2d : public UnaryModule {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, int kernel_size, Conv2dOptions options = {});
  Tensor forward(const Tensor& x) override;
  void reset_parameters();
  std::string extra_repr() const override;
  ops::Conv2dParams params() const;

  std::int64_t in_channels, out_channels;
  int kernel_size;
  Conv2dOptions options;
  Tensor weight, bias;
};

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
};

// Batch normalisation over N (and H, W) per channel. Buffers running_mean, running_var and
// num_batches_tracked as PyTorch (so state dicts match). In eval mode (with running stats) it
// normalises with the running statistics.
class BatchNorm : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  // relu?(forward(x) + residual?) with the add and the ReLU in the normalisation's elementwise pass
  // (batch_norm_act); residual may be undefined.
  Tensor forward_act(const Tensor& x, const Tensor& residual, bool relu);
  void reset_running_stats();
  void reset_parameters();
  std::string extra_repr() const override;

  std::int64_t num_features;
  BatchNormOptions options;
  Tensor weight, bias;                                    // undefined when affine=false
  Tensor running_mean, running_var, num_batches_tracked;  // undefined without tracking

 protected:
  BatchNorm(std::string type_name, std::int64_t num_features, BatchNormOptions options, int min_dim, int max_dim);

 private:
  int min_dim_, max_dim_;
};

// Input [N, C] or [N, C, L].
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(std::int64_t num_features, BatchNormOptions options = {});
};

// Input [N, C, H, W].
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(std::int64_t num_features, BatchNormOptions options = {});
};

// Normalises over the last dimension (of size normalized_shape).
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(std::int64_t normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  std::int64_t normalized_shape;
  double eps;
  bool elementwise_affine;
  Tensor weight, bias;
};

// x / sqrt(mean(x^2) + eps) * weight over the last dimension.
class RMSNorm : public UnaryModule {
 public:
  explicit RMSNorm(std::int64_t normalized_shape, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  std::int64_t normalized_shape;
  double eps;
  Tensor weight;
};

class MaxPool2d : public UnaryModule {
 public:
  explicit MaxPool2d(int kernel_size, int stride = -1, int padding = 0);  // stride -1: = kernel_size
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int kernel_size, stride, padding;
};

class AvgPool2d : public UnaryModule {
 public:
  explicit AvgPool2d(int kernel_size, int stride = -1, int padding = 0, bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int kernel_size, stride, padding;
  bool count_include_pad;
};

class AdaptiveAvgPool2d : public UnaryModule {
 public:
  AdaptiveAvgPool2d(int output_h, int output_w);
  explicit AdaptiveAvgPool2d(int output_size) : AdaptiveAvgPool2d(output_size, output_size) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int output_h, output_w;
};

// Inverted dropout with a counter-based mask. The module keeps a seed (explicit, or drawn from
// the default generator at construction) and an offset that advances by x.numel() per training
// call, so each call gets a fresh mask and a run is reproducible given the seed. Identity in
// eval mode or with p = 0.
//
// graph_safe (for CUDA graphs; set_graph_safe_random() sets it on a whole model): the offset
// lives in an int64 counter on the input's device that the mask kernel reads and a kernel
// advances, so a captured training step draws a fresh mask at each replay. The masks are those of
// the host-offset mode. The counter starts from `offset` (and restarts from it whenever `offset`
// is assigned); `offset` itself stops advancing during graph replays: sync_offset_from_device()
// brings it up to date (e.g. before a checkpoint). The first training forward must run eagerly.
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5, std::optional<std::uint64_t> seed = std::nullopt);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  void sync_offset_from_device();
  // For a kernel that applies this dropout itself (te::attention's fused attention dropout):
  // reserves the mask of `count` elements on `device` exactly as forward() on a contiguous tensor
  // of `count` elements would (the same stream position and advance, the same recompute replay
  // and recording, the same graph-safe device counter), and returns the draw the kernel uses:
  // {seed, offset}, or graph-safe {seed, 0, a copy of the device counter taken before it
  // advanced}. Call it in training with p > 0 only (where forward() draws).
  autograd::RandomDraw reserve(std::int64_t count, Device device);

  double p;
  std::uint64_t seed;
  std::uint64_t offset = 0;  // checkpoint it (with the seed) to resume the exact mask sequence
  bool graph_safe = false;

 private:
  Tensor offset_counter_;           // graph_safe: int64 scalar on the input's device
  std::uint64_t counter_base_ = 0;  // the value `offset` had when the counter last matched it
};

// A lookup table: weight [num_embeddings, embedding_dim] ~ N(0, 1); forward(indices int64).
class Embedding : public UnaryModule {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim);
  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;

  std::int64_t num_embeddings, embedding_dim;
  Tensor weight;
};

// ---- parameter-free modules
class Identity : public UnaryModule {
 public:
  Identity() : UnaryModule("Identity") {}
  Tensor forward(const Tensor& x) override { return x; }
};

class ReLU : public UnaryModule {
 public:
  ReLU() : UnaryModule("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

class GELU : public UnaryModule {
 public:
  explicit GELU(bool tanh_approximation = false) : UnaryModule("GELU"), tanh_approximation(tanh_approximation) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  bool tanh_approximation;
};

class SiLU : public UnaryModule {
 public:
  SiLU() : UnaryModule("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

class Tanh : public UnaryModule {
 public:
  Tanh() : UnaryModule("Tanh") {}
  Tensor forward(const Tensor& x) override;
};

class Sigmoid : public UnaryModule {
 public:
  Sigmoid() : UnaryModule("Sigmoid") {}
  Tensor forward(const Tensor& x) override;
};

class Flatten : public UnaryModule {
 public:
  explicit Flatten(std::int64_t start_dim = 1, std::int64_t end_dim = -1)
      : UnaryModule("Flatten"), start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start_dim, end_dim); }
  std::string extra_repr() const override;
  std::int64_t start_dim, end_dim;
};

}  // namespace kiln::nn
