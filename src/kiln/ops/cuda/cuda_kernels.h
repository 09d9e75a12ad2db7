#pragma once
// Declarations of the CUDA kernels (one file per family in ops/cuda/); register_kernels.cpp puts
// them into the kernel registry. Signatures are those of ops::sig (ops/kernels.h).
#include <span>

#include "kiln/ops/op_kinds.h"
#include "kiln/tensor/tensor.h"

namespace kiln::ops::cuda {

// copy_fill.cu
void copy(const Tensor& src, const Tensor& dst);
void fill(const Tensor& dst, double value);
void accumulate(const Tensor& acc, const Tensor& src);
void arange(const Tensor& dst, double start, double step);
void random(const Tensor& dst, RandomKind kind, std::uint64_t seed, std::uint64_t offset, double a, double b);
void random_device_offset(const Tensor& dst, RandomKind kind, std::uint64_t seed, const Tensor& offset, double a,
                          double b);
// elementwise.cu
void unary(UnaryOp op, const Tensor& in, const Tensor& out, double param);
void unary_backward(UnaryOp op, const Tensor& grad_out, const Tensor& in, const Tensor& out, const Tensor& grad_in,
                    double param);
void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
void binary_scalar(BinaryOp op, const Tensor& a, double scalar, const Tensor& out);
void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);
void clamp(const Tensor& in, double lo, double hi, const Tensor& out);
// reduce.cu
void reduce(ReduceOp op, const Tensor& in, std::span<const int> dims, const Tensor& out);
void variance(const Tensor& in, std::span<const int> dims, int correction, const Tensor& out);
void arg_reduce(bool is_max, const Tensor& in, int dim, const Tensor& out);
// grad_b[k] = sum of grad_y[:, k, :, :] (contiguous NCHW); used by conv2d_backward.
void conv_bias_grad(const Tensor& grad_y, const Tensor& grad_b);
// gemm.cpp
void gemm(const Tensor& a, const Tensor& b, const Tensor& out, bool ta, bool tb, double alpha, double beta);
void gemm_bias(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out, bool ta, bool tb);
// conv.cpp
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& p);
void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& grad_x, const Tensor& grad_w,
                     const Tensor& grad_b, const Conv2dParams& p);
// pool.cu
void max_pool2d_forward(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dParams& p);
void max_pool2d_backward(const Tensor& grad_y, const Tensor& indices, const Tensor& grad_x, const Pool2dParams& p);
void avg_pool2d_forward(const Tensor& x, const Tensor& y, const Pool2dParams& p);
void avg_pool2d_backward(const Tensor& grad_y, const Tensor& grad_x, const Pool2dParams& p);
void adaptive_avg_pool2d_forward(const Tensor& x, const Tensor& y);
void adaptive_avg_pool2d_backward(const Tensor& grad_y, const Tensor& grad_x);
// norm.cu
void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                        const Tensor& running_var, bool training, double momentum, double eps, const Tensor& residual,
                        bool relu, const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd);
void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& y, bool relu, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_invstd, const Tensor& grad_x, const Tensor& grad_w,
                         const Tensor& grad_b, const Tensor& grad_residual);
void layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd);
void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                         const Tensor& grad_x, const Tensor& grad_w, const Tensor& grad_b);
void rms_norm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd);
void rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& grad_x,
                       const Tensor& grad_w);
// softmax_loss.cu
void softmax_forward(const Tensor& x, bool log, const Tensor& y);
void softmax_backward(const Tensor& grad_y, const Tensor& y, bool log, const Tensor& grad_x);
void cross_entropy_forward(const Tensor& logits, const Tensor& target, std::int64_t ignore_index,
                           double label_smoothing, const Tensor& loss, const Tensor& lse);
void cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                            std::int64_t ignore_index, double label_smoothing, const Tensor& grad_logits);
// indexing.cu
void index_select(const Tensor& in, int dim, const Tensor& index, const Tensor& out);
void index_add(const Tensor& out, int dim, const Tensor& index, const Tensor& src);
void gather(const Tensor& in, int dim, const Tensor& index, const Tensor& out);
void scatter_add(const Tensor& out, int dim, const Tensor& index, const Tensor& src);
void topk(const Tensor& in, std::int64_t k, bool largest, const Tensor& values, const Tensor& indices);
// optim.cu
void adam_step(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> exp_avg,
               std::span<const Tensor> exp_avg_sq, std::span<const Tensor> model_params, const AdamParams& p);
void sgd_step(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> momentum_buffers,
              std::span<const Tensor> model_params, const SgdParams& p);
void sum_of_squares(std::span<const Tensor> tensors, const Tensor& out);

}  // namespace kiln::ops::cuda
