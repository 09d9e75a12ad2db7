// The CUDA kernel table. Each kernel family lives in its own ops/cuda/<family>.cu (or .cpp for the
// cuBLASLt / cuDNN wrappers); declarations are in cuda_kernels.h.
#include "kiln/ops/cuda/cuda_kernels.h"

namespace kiln::ops {

void register_cuda_kernels(Kernels& k) {
  k.copy = cuda::copy;
  k.fill = cuda::fill;
  k.arange = cuda::arange;
  k.random = cuda::random;
  k.random_device_offset = cuda::random_device_offset;
  k.unary = cuda::unary;
  k.unary_backward = cuda::unary_backward;
  k.binary = cuda::binary;
  k.binary_scalar = cuda::binary_scalar;
  k.where = cuda::where;
  k.clamp = cuda::clamp;
  k.reduce = cuda::reduce;
  k.variance = cuda::variance;
  k.arg_reduce = cuda::arg_reduce;
  k.gemm = cuda::gemm;
  k.conv2d_channels_last = true;
  k.conv2d_forward = cuda::conv2d_forward;
  k.conv2d_backward = cuda::conv2d_backward;
  k.max_pool2d_forward = cuda::max_pool2d_forward;
  k.max_pool2d_backward = cuda::max_pool2d_backward;
  k.avg_pool2d_forward = cuda::avg_pool2d_forward;
  k.avg_pool2d_backward = cuda::avg_pool2d_backward;
  k.adaptive_avg_pool2d_forward = cuda::adaptive_avg_pool2d_forward;
  k.adaptive_avg_pool2d_backward = cuda::adaptive_avg_pool2d_backward;
  k.batch_norm_channels_last = true;
  k.batch_norm_forward = cuda::batch_norm_forward;
  k.batch_norm_backward = cuda::batch_norm_backward;
  k.layer_norm_forward = cuda::layer_norm_forward;
  k.layer_norm_backward = cuda::layer_norm_backward;
  k.rms_norm_forward = cuda::rms_norm_forward;
  k.rms_norm_backward = cuda::rms_norm_backward;
  k.softmax_forward = cuda::softmax_forward;
  k.softmax_backward = cuda::softmax_backward;
  k.cross_entropy_forward = cuda::cross_entropy_forward;
  k.cross_entropy_backward = cuda::cross_entropy_backward;
  k.index_select = cuda::index_select;
  k.index_add = cuda::index_add;
  k.gather = cuda::gather;
  k.scatter_add = cuda::scatter_add;
  k.topk = cuda::topk;
  k.adam_step = cuda::adam_step;
  k.sgd_step = cuda::sgd_step;
  k.sum_of_squares = cuda::sum_of_squares;
  k.augment_images = cuda::augment_images;
}

}  // namespace kiln::ops
