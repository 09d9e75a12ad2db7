#pragma once
// The differentiable op API: what models are written with. Each function computes with the raw
// ops in ops/ and records its backward (autograd/functions/<family>.cpp). Shapes follow PyTorch.
#include <optional>
#include <vector>

#include "kiln/ops/op_kinds.h"
#include "kiln/tensor/tensor.h"

namespace kiln {

// ---- elementwise (functions/elementwise.cpp)
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor sub(const Tensor& a, double s);
Tensor rsub(double s, const Tensor& a);  // s - a
Tensor mul(const Tensor& a, double s);
Tensor div(const Tensor& a, double s);
Tensor rdiv(double s, const Tensor& a);  // s / a
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
Tensor gelu(const Tensor& x, bool tanh_approximation = false);
Tensor silu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor clamp(const Tensor& x, double lo, double hi);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Comparisons (not differentiable; bool results).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);
Tensor operator-(const Tensor& x);

// ---- reductions (functions/reduce.cpp). Empty dims: all dimensions.
Tensor sum(const Tensor& x, std::vector<std::int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<std::int64_t> dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, std::vector<std::int64_t> dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, std::vector<std::int64_t> dims = {}, bool keepdim = false);
Tensor var(const Tensor& x, std::vector<std::int64_t> dims = {}, int correction = 1, bool keepdim = false);
Tensor argmax(const Tensor& x, std::int64_t dim, bool keepdim = false);  // not differentiable
Tensor argmin(const Tensor& x, std::int64_t dim, bool keepdim = false);

// ---- linear algebra (functions/linalg.cpp)
// matmul: 1-D/2-D/batched with broadcasting of batch dims, as torch.matmul.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);  // [B,M,K] x [B,K,N]
// y = x W^T + b; x [..., in], weight [out, in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- convolution and pooling, NCHW (functions/conv_pool.cpp)
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), ops::Conv2dParams p = {});
// x [N, C, H, W] stored channels-last (a copy unless it already is); the gradient passes through.
// On CUDA a channels-last input keeps convolutions, batch norm and elementwise ops channels-last.
Tensor to_channels_last(const Tensor& x);
Tensor max_pool2d(const Tensor& x, int kernel, int stride = -1, int padding = 0);
Tensor avg_pool2d(const Tensor& x, int kernel, int stride = -1, int padding = 0, bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& x, int out_h, int out_w);

// ---- normalisation (functions/norm.cpp)
// running_mean/var are updated in place in training mode (not differentiable).
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5);
// relu?(batch_norm(x) + residual?) with the add and the ReLU fused into the normalisation's
// elementwise pass, forward and backward (ResNet's blocks); residual may be undefined. The same
// values as the three ops composed, rounded once instead of after each.
Tensor batch_norm_act(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                      const Tensor& running_var, bool training, double momentum, double eps, const Tensor& residual,
                      bool relu);
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

// ---- softmax and losses (functions/softmax_loss.cpp), over `dim` (default last)
Tensor softmax(const Tensor& x, std::int64_t dim = -1);
Tensor log_softmax(const Tensor& x, std::int64_t dim = -1);
// logits [N, C] (or [N, C, ...] flattened), target int64 [N]; mean over non-ignored rows.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, std::int64_t ignore_index = -100,
                     double label_smoothing = 0.0);
Tensor mse_loss(const Tensor& input, const Tensor& target);

// ---- dropout and embedding (functions/dropout_embedding.cpp)
// Counter-based mask: the same (seed, offset) gives the same mask on every device.
Tensor dropout(const Tensor& x, double p, bool training, std::uint64_t seed, std::uint64_t offset = 0);
// Training-mode dropout whose Philox offset lives in `offset` (an int64 scalar on x's device): the
// mask kernel reads it when it runs and a kernel then advances it by x.numel(), so a captured CUDA
// graph draws a fresh mask at every replay. Same masks as dropout(x, p, true, seed, o) with o the
// counter's value.
Tensor dropout_advancing(const Tensor& x, double p, std::uint64_t seed, const Tensor& offset);
Tensor embedding(const Tensor& weight, const Tensor& indices);

// ---- joining and indexing (functions/indexing.cpp)
Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, std::int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim = 0);
std::vector<Tensor> split_sizes(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t dim = 0);
Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index);
Tensor scatter_add(const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src);
// Values and int64 indices of the k largest (or smallest) along the last dimension.
std::pair<Tensor, Tensor> topk(const Tensor& x, std::int64_t k, bool largest = true);

}  // namespace kiln
