// The CUDA kernel table. Each kernel family lives in its own ops/cuda/<family>.cu (or .cpp for the
// cuBLASLt / cuDNN wrappers); declarations are in cuda_kernels.h.
#include "kiln/ops/cuda/cuda_kernels.h"
#include "kiln/ops/kernels.h"

namespace kiln::ops {

void register_cuda_kernels(KernelRegistry& r) {
  constexpr DeviceKind d = DeviceKind::CUDA;
  r.add(op::copy, d, cuda::copy);
  r.add(op::fill, d, cuda::fill);
  r.add(op::accumulate, d, cuda::accumulate);
  r.add(op::arange, d, cuda::arange);
  r.add(op::random, d, cuda::random);
  r.add(op::random_device_offset, d, cuda::random_device_offset);
  r.add(op::unary, d, cuda::unary);
  r.add(op::unary_backward, d, cuda::unary_backward);
  r.add(op::binary, d, cuda::binary);
  r.add(op::binary_scalar, d, cuda::binary_scalar);
  r.add(op::where, d, cuda::where);
  r.add(op::clamp, d, cuda::clamp);
  r.add(op::reduce, d, cuda::reduce);
  r.add(op::variance, d, cuda::variance);
  r.add(op::arg_reduce, d, cuda::arg_reduce);
  r.add(op::gemm, d, cuda::gemm);
  r.add(op::gemm_bias, d, cuda::gemm_bias);
  r.add(op::conv2d_forward, d, cuda::conv2d_forward, {}, kTakesChannelsLast);
  r.add(op::conv2d_backward, d, cuda::conv2d_backward, {}, kTakesChannelsLast);
  r.add(op::max_pool2d_forward, d, cuda::max_pool2d_forward);
  r.add(op::max_pool2d_backward, d, cuda::max_pool2d_backward);
  r.add(op::avg_pool2d_forward, d, cuda::avg_pool2d_forward);
  r.add(op::avg_pool2d_backward, d, cuda::avg_pool2d_backward);
  r.add(op::adaptive_avg_pool2d_forward, d, cuda::adaptive_avg_pool2d_forward, {}, kTakesChannelsLast);
  r.add(op::adaptive_avg_pool2d_backward, d, cuda::adaptive_avg_pool2d_backward, {}, kTakesChannelsLast);
  r.add(op::batch_norm_forward, d, cuda::batch_norm_forward, {}, kTakesChannelsLast);
  r.add(op::batch_norm_backward, d, cuda::batch_norm_backward, {}, kTakesChannelsLast);
  r.add(op::layer_norm_forward, d, cuda::layer_norm_forward);
  r.add(op::layer_norm_backward, d, cuda::layer_norm_backward);
  r.add(op::rms_norm_forward, d, cuda::rms_norm_forward);
  r.add(op::rms_norm_backward, d, cuda::rms_norm_backward);
  r.add(op::softmax_forward, d, cuda::softmax_forward);
  r.add(op::softmax_backward, d, cuda::softmax_backward);
  r.add(op::cross_entropy_forward, d, cuda::cross_entropy_forward);
  r.add(op::cross_entropy_backward, d, cuda::cross_entropy_backward);
  r.add(op::index_select, d, cuda::index_select);
  r.add(op::index_add, d, cuda::index_add);
  r.add(op::gather, d, cuda::gather);
  r.add(op::scatter_add, d, cuda::scatter_add);
  r.add(op::topk, d, cuda::topk);
  r.add(op::adam_step, d, cuda::adam_step);
  r.add(op::sgd_step, d, cuda::sgd_step);
  r.add(op::sum_of_squares, d, cuda::sum_of_squares);
}

}  // namespace kiln::ops
