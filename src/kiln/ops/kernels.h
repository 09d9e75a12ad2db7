#pragma once
// Kernels: the table one backend fills in. The op wrappers in ops/*.cpp check their arguments,
// allocate outputs and look the kernel up by the device's kind; a missing entry is an error that
// names the op and the device. Conventions for every kernel:
// - all tensors are on the same device (the wrappers check);
// - outputs are allocated by the caller, contiguous unless stated;
// - inputs may be strided unless stated ("contiguous" below means the wrapper made them so).
#include <span>

#include "kiln/ops/op_kinds.h"
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

struct Kernels {
  // dst[i] = convert(src[i]); same shape, any strides and dtypes.
  void (*copy)(const Tensor& src, const Tensor& dst) = nullptr;
  void (*fill)(const Tensor& dst, double value) = nullptr;  // dst may be strided
  void (*arange)(const Tensor& dst, double start, double step) = nullptr;
  // Philox-4x32-10 keyed by seed, counter = element index + offset: same numbers on every backend.
  // Uniform in [a, b); Normal with mean a and std b; Bernoulli(p = a) as 0/1.
  void (*random)(const Tensor& dst, RandomKind kind, std::uint64_t seed, std::uint64_t offset, double a,
                 double b) = nullptr;
  // As random, but the counter offset is read when the kernel runs from `offset` (an int64 scalar
  // on dst's device): a CUDA graph replay then draws fresh numbers once `offset` has advanced.
  void (*random_device_offset)(const Tensor& dst, RandomKind kind, std::uint64_t seed, const Tensor& offset, double a,
                               double b) = nullptr;

  // Elementwise. `in`/`a`/`b` are already broadcast (expanded views) to out's shape.
  void (*unary)(UnaryOp op, const Tensor& in, const Tensor& out, double param) = nullptr;
  // grad_in = grad_out * d op(in) / d in; `out` is op(in) (used by sigmoid/tanh/exp).
  void (*unary_backward)(UnaryOp op, const Tensor& grad_out, const Tensor& in, const Tensor& out, const Tensor& grad_in,
                         double param) = nullptr;
  void (*binary)(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) = nullptr;
  void (*binary_scalar)(BinaryOp op, const Tensor& a, double scalar, const Tensor& out) = nullptr;
  void (*where)(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) = nullptr;
  void (*clamp)(const Tensor& in, double lo, double hi, const Tensor& out) = nullptr;

  // Reductions over `dims` (sorted, unique); out has the keepdim shape (size 1 on reduced dims).
  void (*reduce)(ReduceOp op, const Tensor& in, std::span<const int> dims, const Tensor& out) = nullptr;
  // Unbiased (correction=1) or biased variance over dims; out as in reduce.
  void (*variance)(const Tensor& in, std::span<const int> dims, int correction, const Tensor& out) = nullptr;
  // Index (int64) of the max/min along `dim`; out has the keepdim shape.
  void (*arg_reduce)(bool is_max, const Tensor& in, int dim, const Tensor& out) = nullptr;

  // out[b] = alpha * op(a[b]) @ op(b[b]) + beta * out[b]; a, b, out are 3-D (batch, rows, cols),
  // contiguous; op transposes when the flag is set. f32/f64/bf16/f16 (f32 accumulation).
  void (*gemm)(const Tensor& a, const Tensor& b, const Tensor& out, bool trans_a, bool trans_b, double alpha,
               double beta) = nullptr;

  // x, w, y (and grad_y, grad_x, grad_w) all NCHW-contiguous, or, where conv2d_channels_last is
  // set, all channels-last (ops::is_channels_last). bias may be undefined.
  bool conv2d_channels_last = false;
  void (*conv2d_forward)(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                         const Conv2dParams& p) = nullptr;
  // Any of grad_x, grad_w, grad_b may be undefined (not needed).
  void (*conv2d_backward)(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& grad_x,
                          const Tensor& grad_w, const Tensor& grad_b, const Conv2dParams& p) = nullptr;
  // indices (int64, flat h*w position in the input plane) are saved for backward.
  void (*max_pool2d_forward)(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dParams& p) = nullptr;
  void (*max_pool2d_backward)(const Tensor& grad_y, const Tensor& indices, const Tensor& grad_x,
                              const Pool2dParams& p) = nullptr;  // grad_x zeroed by the kernel
  void (*avg_pool2d_forward)(const Tensor& x, const Tensor& y, const Pool2dParams& p) = nullptr;
  void (*avg_pool2d_backward)(const Tensor& grad_y, const Tensor& grad_x, const Pool2dParams& p) = nullptr;
  void (*adaptive_avg_pool2d_forward)(const Tensor& x, const Tensor& y) = nullptr;
  void (*adaptive_avg_pool2d_backward)(const Tensor& grad_y, const Tensor& grad_x) = nullptr;

  // Batch norm over N,H,W per channel (x NCHW or NC). Training: normalises with batch statistics,
  // writes save_mean/save_invstd and updates running stats (momentum as PyTorch: unbiased var).
  // Eval: uses running stats; save_* untouched. weight/bias may be undefined (affine=false).
  // save_mean/save_invstd are f32 [C]. Running stats may be undefined (not tracked: batch statistics
  // are used, as with training=true) or of another floating dtype than x. x, y, grad_y, grad_x are
  // contiguous or, where batch_norm_channels_last is set, may all be channels-last instead.
  bool batch_norm_channels_last = false;
  void (*batch_norm_forward)(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                             const Tensor& running_var, bool training, double momentum, double eps, const Tensor& y,
                             const Tensor& save_mean, const Tensor& save_invstd) = nullptr;
  void (*batch_norm_backward)(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                              const Tensor& save_invstd, const Tensor& grad_x, const Tensor& grad_w,
                              const Tensor& grad_b) = nullptr;
  // Over the last dimension; mean/rstd have shape [rows] (f32).
  void (*layer_norm_forward)(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                             const Tensor& mean, const Tensor& rstd) = nullptr;
  void (*layer_norm_backward)(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& mean,
                              const Tensor& rstd, const Tensor& grad_x, const Tensor& grad_w,
                              const Tensor& grad_b) = nullptr;
  void (*rms_norm_forward)(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) = nullptr;
  void (*rms_norm_backward)(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& rstd,
                            const Tensor& grad_x, const Tensor& grad_w) = nullptr;

  // Softmax / log-softmax over the last dimension of a contiguous tensor.
  void (*softmax_forward)(const Tensor& x, bool log, const Tensor& y) = nullptr;
  void (*softmax_backward)(const Tensor& grad_y, const Tensor& y, bool log, const Tensor& grad_x) = nullptr;
  // logits [N, C] contiguous, target int64 [N]. loss [N] (0 where ignored); lse [N] f32 saved for backward.
  void (*cross_entropy_forward)(const Tensor& logits, const Tensor& target, std::int64_t ignore_index,
                                double label_smoothing, const Tensor& loss, const Tensor& lse) = nullptr;
  // grad_logits = (softmax - smoothed one-hot) * grad_loss[row]; grad_loss [N].
  void (*cross_entropy_backward)(const Tensor& grad_loss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                                 std::int64_t ignore_index, double label_smoothing,
                                 const Tensor& grad_logits) = nullptr;

  // out = in.index_select(dim, index); index int64 1-D.
  void (*index_select)(const Tensor& in, int dim, const Tensor& index, const Tensor& out) = nullptr;
  // out.index_add_(dim, index, src) (atomic on GPUs); out is not zeroed by the kernel.
  void (*index_add)(const Tensor& out, int dim, const Tensor& index, const Tensor& src) = nullptr;
  void (*gather)(const Tensor& in, int dim, const Tensor& index, const Tensor& out) = nullptr;
  void (*scatter_add)(const Tensor& out, int dim, const Tensor& index, const Tensor& src) = nullptr;
  // Along the last dimension of a contiguous tensor; values and int64 indices sorted.
  void (*topk)(const Tensor& in, std::int64_t k, bool largest, const Tensor& values, const Tensor& indices) = nullptr;

  // Optimizer steps over many parameters in one call (one fused launch on GPUs), all contiguous.
  // params and their state are f32 (f64 too on the CPU); grads are the params' dtype or bf16/f16
  // (gradients accumulated in reduced precision, read as f32). model_params is empty, or one
  // tensor per param (bf16/f16/f32) that receives the updated value rounded to its dtype: the
  // model's low-precision copy of fp32 master weights, written in the same pass.
  void (*adam_step)(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> exp_avg,
                    std::span<const Tensor> exp_avg_sq, std::span<const Tensor> model_params,
                    const AdamParams& p) = nullptr;
  void (*sgd_step)(std::span<const Tensor> params, std::span<const Tensor> grads,
                   std::span<const Tensor> momentum_buffers, std::span<const Tensor> model_params,
                   const SgdParams& p) = nullptr;
  // Sum of squares of every tensor into out (f32 scalar), for clip-by-global-norm.
  void (*sum_of_squares)(std::span<const Tensor> tensors, const Tensor& out) = nullptr;

  // images uint8 [N, C, H, W] contiguous, indices int64 [B], out f32 [B, C, H, W]:
  // out[i] = normalise(augment(images[indices[i]])) (see AugmentParams).
  void (*augment_images)(const Tensor& images, const Tensor& indices, const Tensor& out,
                         const AugmentParams& p) = nullptr;
};

// The table for a device kind, filled once on first use by register_<backend>_kernels().
const Kernels& kernels_for(DeviceKind kind);
void register_cpu_kernels(Kernels& k);
#if KILN_WITH_CUDA
void register_cuda_kernels(Kernels& k);
#endif

// Looks up one kernel for a device: KILN_KERNEL(device, copy)(src, dst). A missing kernel raises
// "<op>: no kernel for device <d>".
#define KILN_KERNEL(device, name)                                                     \
  ([&]() {                                                                            \
    auto* fn_ = ::kiln::ops::kernels_for((device).kind).name;                         \
    KILN_CHECK(fn_ != nullptr, "{}: no kernel for device {}", #name, (device).str()); \
    return fn_;                                                                       \
  }())

}  // namespace kiln::ops
