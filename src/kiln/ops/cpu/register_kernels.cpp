#include "kiln/ops/cpu/cpu_kernels.h"

namespace kiln::ops {

void register_cpu_kernels(Kernels& k) {
  k.copy = cpu::copy;
  k.fill = cpu::fill;
  k.arange = cpu::arange;
  k.random = cpu::random;
  k.random_device_offset = cpu::random_device_offset;
  k.unary = cpu::unary;
  k.unary_backward = cpu::unary_backward;
  k.binary = cpu::binary;
  k.binary_scalar = cpu::binary_scalar;
  k.where = cpu::where;
  k.clamp = cpu::clamp;
  k.reduce = cpu::reduce;
  k.variance = cpu::variance;
  k.arg_reduce = cpu::arg_reduce;
  k.gemm = cpu::gemm;
  k.conv2d_forward = cpu::conv2d_forward;
  k.conv2d_backward = cpu::conv2d_backward;
  k.max_pool2d_forward = cpu::max_pool2d_forward;
  k.max_pool2d_backward = cpu::max_pool2d_backward;
  k.avg_pool2d_forward = cpu::avg_pool2d_forward;
  k.avg_pool2d_backward = cpu::avg_pool2d_backward;
  k.adaptive_avg_pool2d_forward = cpu::adaptive_avg_pool2d_forward;
  k.adaptive_avg_pool2d_backward = cpu::adaptive_avg_pool2d_backward;
  k.batch_norm_forward = cpu::batch_norm_forward;
  k.batch_norm_backward = cpu::batch_norm_backward;
  k.layer_norm_forward = cpu::layer_norm_forward;
  k.layer_norm_backward = cpu::layer_norm_backward;
  k.rms_norm_forward = cpu::rms_norm_forward;
  k.rms_norm_backward = cpu::rms_norm_backward;
  k.softmax_forward = cpu::softmax_forward;
  k.softmax_backward = cpu::softmax_backward;
  k.cross_entropy_forward = cpu::cross_entropy_forward;
  k.cross_entropy_backward = cpu::cross_entropy_backward;
  k.index_select = cpu::index_select;
  k.index_add = cpu::index_add;
  k.gather = cpu::gather;
  k.scatter_add = cpu::scatter_add;
  k.topk = cpu::topk;
  k.adam_step = cpu::adam_step;
  k.sgd_step = cpu::sgd_step;
  k.sum_of_squares = cpu::sum_of_squares;
  k.augment_images = cpu::augment_images;
}

}  // namespace kiln::ops
