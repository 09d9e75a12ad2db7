#pragma once
// The built-in ops: the kernels every backend provides. Each op is a kernel type (namespace sig)
// and a handle (namespace op) into the kernel registry (ops/kernel_registry.h); the op wrappers in
// ops/*.cpp check their arguments, allocate outputs and call `KILN_KERNEL(device, name)(...)`.
// A missing kernel is an error that names the op and the device. Conventions for every kernel:
// - all tensors are on the same device (the wrappers check);
// - outputs are allocated by the caller, contiguous unless stated;
// - inputs may be strided unless stated ("contiguous" below means the wrapper made them so).
// Built-in kernels take every dtype and check what they support themselves.
//
// Adding a built-in op: its kernel type here (sig::<name>) and its name in KILN_BUILTIN_OPS; one
// kernel per backend (ops/cpu/<family>.cpp, ops/cuda/<family>.cu, declared in cpu_kernels.h /
// cuda_kernels.h); one line in each backend's register_kernels.cpp; one case in
// tests/backend_ops/cases_*.cpp (the harness fails while a registered kernel has no case).
#include <span>

#include "kiln/ops/kernel_registry.h"
#include "kiln/ops/op_kinds.h"
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

// The kernel types.
namespace sig {
// dst[i] = convert(src[i]); same shape, any strides and dtypes.
using copy = void(const Tensor& src, const Tensor& dst);
using fill = void(const Tensor& dst, double value);  // dst may be strided
// acc[i] += src[i] converted to acc's dtype (float32 or float64; src any floating dtype), added in
// acc's precision; same shape, any strides. One pass where a conversion and an add would be two:
// a bfloat16 gradient added into its float32 accumulator.
using accumulate = void(const Tensor& acc, const Tensor& src);
using arange = void(const Tensor& dst, double start, double step);
// Philox-4x32-10 keyed by seed, counter = element index + offset: same numbers on every backend.
// Uniform in [a, b); Normal with mean a and std b; Bernoulli(p = a) as 0/1.
using random = void(const Tensor& dst, RandomKind kind, std::uint64_t seed, std::uint64_t offset, double a, double b);
// As random, but the counter offset is read when the kernel runs from `offset` (an int64 scalar
// on dst's device): a CUDA graph replay then draws fresh numbers once `offset` has advanced.
using random_device_offset = void(const Tensor& dst, RandomKind kind, std::uint64_t seed, const Tensor& offset,
                                  double a, double b);

// Elementwise. `in`/`a`/`b` are already broadcast (expanded views) to out's shape.
using unary = void(UnaryOp op, const Tensor& in, const Tensor& out, double param);
// grad_in = grad_out * d op(in) / d in; `out` is op(in) (used by sigmoid/tanh/exp).
using unary_backward = void(UnaryOp op, const Tensor& grad_out, const Tensor& in, const Tensor& out,
                            const Tensor& grad_in, double param);
using binary = void(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
using binary_scalar = void(BinaryOp op, const Tensor& a, double scalar, const Tensor& out);
using where = void(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);
using clamp = void(const Tensor& in, double lo, double hi, const Tensor& out);

// Reductions over `dims` (sorted, unique); out has the keepdim shape (size 1 on reduced dims).
using reduce = void(ReduceOp op, const Tensor& in, std::span<const int> dims, const Tensor& out);
// Unbiased (correction=1) or biased variance over dims; out as in reduce.
using variance = void(const Tensor& in, std::span<const int> dims, int correction, const Tensor& out);
// Index (int64) of the max/min along `dim`; out has the keepdim shape.
using arg_reduce = void(bool is_max, const Tensor& in, int dim, const Tensor& out);

// out[b] = alpha * op(a[b]) @ op(b[b]) + beta * out[b]; a, b, out are 3-D (batch, rows, cols),
// contiguous; op transposes when the flag is set. f32/f64/bf16/f16 (f32 accumulation).
using gemm = void(const Tensor& a, const Tensor& b, const Tensor& out, bool trans_a, bool trans_b, double alpha,
                  double beta);
// out[b] = op(a[b]) @ op(b[b]) + bias, bias [n] added to every row (a linear layer's forward), rounded
// once: on CUDA cuBLASLt's BIAS epilogue inside the GEMM instead of a second pass over out.
using gemm_bias = void(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out, bool trans_a,
                       bool trans_b);

// x, w, y (and grad_y, grad_x, grad_w) all NCHW-contiguous, or, where the device's kernel is
// registered with kTakesChannelsLast, all channels-last (ops::is_channels_last). bias may be undefined.
using conv2d_forward = void(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                            const Conv2dParams& p);
// Any of grad_x, grad_w, grad_b may be undefined (not needed).
using conv2d_backward = void(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& grad_x,
                             const Tensor& grad_w, const Tensor& grad_b, const Conv2dParams& p);
// indices (int64, flat h*w position in the input plane) are saved for backward.
using max_pool2d_forward = void(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dParams& p);
using max_pool2d_backward = void(const Tensor& grad_y, const Tensor& indices, const Tensor& grad_x,
                                 const Pool2dParams& p);  // grad_x zeroed by the kernel
using avg_pool2d_forward = void(const Tensor& x, const Tensor& y, const Pool2dParams& p);
using avg_pool2d_backward = void(const Tensor& grad_y, const Tensor& grad_x, const Pool2dParams& p);
// x and y (grad_y and grad_x) contiguous or, where the device's kernel has kTakesChannelsLast, both
// channels-last instead (the ResNet head's global average pool on an NHWC activation).
using adaptive_avg_pool2d_forward = void(const Tensor& x, const Tensor& y);
using adaptive_avg_pool2d_backward = void(const Tensor& grad_y, const Tensor& grad_x);

// Batch norm over N,H,W per channel (x NCHW or NC). Training: normalises with batch statistics,
// writes save_mean/save_invstd and updates running stats (momentum as PyTorch: unbiased var).
// Eval: uses running stats; save_* untouched. weight/bias may be undefined (affine=false).
// save_mean/save_invstd are f32 [C]. Running stats may be undefined (not tracked: batch statistics
// are used, as with training=true) or of another floating dtype than x. x, y, grad_y, grad_x are
// contiguous or, where the device's kernel has kTakesChannelsLast, may all be channels-last instead.
// The fused epilogue (ResNet's blocks): y = relu?(x * scale + shift + residual?), the residual (or
// undefined) in x's dtype and layout; the ReLU keeps NaN (v < 0 ? 0 : v).
using batch_norm_forward = void(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                const Tensor& running_var, bool training, double momentum, double eps,
                                const Tensor& residual, bool relu, const Tensor& y, const Tensor& save_mean,
                                const Tensor& save_invstd);
// With relu, the gradient that reaches the normalisation is grad_y where the forward's output y is
// > 0, else 0 (y in x's layout; undefined without relu); grad_residual (defined only with relu, the
// residual's gradient) receives that masked gradient. grad_x, grad_w, grad_b may be undefined.
using batch_norm_backward = void(const Tensor& grad_y, const Tensor& x, const Tensor& y, bool relu,
                                 const Tensor& weight, const Tensor& save_mean, const Tensor& save_invstd,
                                 const Tensor& grad_x, const Tensor& grad_w, const Tensor& grad_b,
                                 const Tensor& grad_residual);
// Over the last dimension; mean/rstd have shape [rows] (f32).
using layer_norm_forward = void(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                                const Tensor& mean, const Tensor& rstd);
using layer_norm_backward = void(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& grad_x, const Tensor& grad_w, const Tensor& grad_b);
using rms_norm_forward = void(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd);
using rms_norm_backward = void(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& rstd,
                               const Tensor& grad_x, const Tensor& grad_w);

// Softmax / log-softmax over the last dimension of a contiguous tensor.
using softmax_forward = void(const Tensor& x, bool log, const Tensor& y);
using softmax_backward = void(const Tensor& grad_y, const Tensor& y, bool log, const Tensor& grad_x);
// logits [N, C] contiguous, target int64 [N]. loss [N] (0 where ignored); lse [N] f32 saved for backward.
using cross_entropy_forward = void(const Tensor& logits, const Tensor& target, std::int64_t ignore_index,
                                   double label_smoothing, const Tensor& loss, const Tensor& lse);
// grad_logits = (softmax - smoothed one-hot) * grad_loss[row]; grad_loss [N].
using cross_entropy_backward = void(const Tensor& grad_loss, const Tensor& logits, const Tensor& target,
                                    const Tensor& lse, std::int64_t ignore_index, double label_smoothing,
                                    const Tensor& grad_logits);

// out = in.index_select(dim, index); index int64 1-D.
using index_select = void(const Tensor& in, int dim, const Tensor& index, const Tensor& out);
// out.index_add_(dim, index, src) (atomic on GPUs); out is not zeroed by the kernel.
using index_add = void(const Tensor& out, int dim, const Tensor& index, const Tensor& src);
using gather = void(const Tensor& in, int dim, const Tensor& index, const Tensor& out);
using scatter_add = void(const Tensor& out, int dim, const Tensor& index, const Tensor& src);
// Along the last dimension of a contiguous tensor; values and int64 indices sorted.
using topk = void(const Tensor& in, std::int64_t k, bool largest, const Tensor& values, const Tensor& indices);

// Optimizer steps over many parameters in one call (one fused launch on GPUs), all contiguous.
// params and their state are f32 (f64 too on the CPU); grads are the params' dtype or bf16/f16
// (gradients accumulated in reduced precision, read as f32). model_params is empty, or one
// tensor per param (bf16/f16/f32) that receives the updated value rounded to its dtype: the
// model's low-precision copy of fp32 master weights, written in the same pass.
using adam_step = void(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> exp_avg,
                       std::span<const Tensor> exp_avg_sq, std::span<const Tensor> model_params, const AdamParams& p);
using sgd_step = void(std::span<const Tensor> params, std::span<const Tensor> grads,
                      std::span<const Tensor> momentum_buffers, std::span<const Tensor> model_params,
                      const SgdParams& p);
// Sum of squares of every tensor into out (f32 scalar), for clip-by-global-norm.
using sum_of_squares = void(std::span<const Tensor> tensors, const Tensor& out);
}  // namespace sig

// Every built-in op, in id order.
#define KILN_BUILTIN_OPS(X)       \
  X(copy)                         \
  X(fill)                         \
  X(accumulate)                   \
  X(arange)                       \
  X(random)                       \
  X(random_device_offset)         \
  X(unary)                        \
  X(unary_backward)               \
  X(binary)                       \
  X(binary_scalar)                \
  X(where)                        \
  X(clamp)                        \
  X(reduce)                       \
  X(variance)                     \
  X(arg_reduce)                   \
  X(gemm)                         \
  X(gemm_bias)                    \
  X(conv2d_forward)               \
  X(conv2d_backward)              \
  X(max_pool2d_forward)           \
  X(max_pool2d_backward)          \
  X(avg_pool2d_forward)           \
  X(avg_pool2d_backward)          \
  X(adaptive_avg_pool2d_forward)  \
  X(adaptive_avg_pool2d_backward) \
  X(batch_norm_forward)           \
  X(batch_norm_backward)          \
  X(layer_norm_forward)           \
  X(layer_norm_backward)          \
  X(rms_norm_forward)             \
  X(rms_norm_backward)            \
  X(softmax_forward)              \
  X(softmax_backward)             \
  X(cross_entropy_forward)        \
  X(cross_entropy_backward)       \
  X(index_select)                 \
  X(index_add)                    \
  X(gather)                       \
  X(scatter_add)                  \
  X(topk)                         \
  X(adam_step)                    \
  X(sgd_step)                     \
  X(sum_of_squares)

enum class BuiltinOp : OpId {
#define KILN_BUILTIN_OP_ENUM(name) name,
  KILN_BUILTIN_OPS(KILN_BUILTIN_OP_ENUM)
#undef KILN_BUILTIN_OP_ENUM
      count
};
inline constexpr OpId kNumBuiltinOps = static_cast<OpId>(BuiltinOp::count);

// The handles: ops::kernel(op::copy, device)(src, dst).
namespace op {
#define KILN_BUILTIN_OP_HANDLE(name) inline constexpr KernelOp<sig::name> name{static_cast<OpId>(BuiltinOp::name)};
KILN_BUILTIN_OPS(KILN_BUILTIN_OP_HANDLE)
#undef KILN_BUILTIN_OP_HANDLE
}  // namespace op

// Declares the built-in ops in a registry (every registry has them, with the same ids).
void declare_builtin_ops(KernelRegistry& r);
// Each backend's kernels of the built-in ops, registered on first use of kernel_registry().
void register_cpu_kernels(KernelRegistry& r);
#if KILN_WITH_CUDA
void register_cuda_kernels(KernelRegistry& r);
#endif

// Looks up a built-in op's kernel for a device: KILN_KERNEL(device, copy)(src, dst). A missing
// kernel raises "copy: no kernel for device <d> (registered: ...)".
#define KILN_KERNEL(device, name) ::kiln::ops::kernel(::kiln::ops::op::name, (device))

}  // namespace kiln::ops
