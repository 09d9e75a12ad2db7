#include "kiln/ops/cpu/cpu_kernels.h"
#include "kiln/ops/kernels.h"

namespace kiln::ops {

void register_cpu_kernels(KernelRegistry& r) {
  constexpr DeviceKind d = DeviceKind::CPU;
  r.add(op::copy, d, cpu::copy);
  r.add(op::fill, d, cpu::fill);
  r.add(op::accumulate, d, cpu::accumulate);
  r.add(op::arange, d, cpu::arange);
  r.add(op::random, d, cpu::random);
  r.add(op::random_device_offset, d, cpu::random_device_offset);
  r.add(op::unary, d, cpu::unary);
  r.add(op::unary_backward, d, cpu::unary_backward);
  r.add(op::binary, d, cpu::binary);
  r.add(op::binary_scalar, d, cpu::binary_scalar);
  r.add(op::where, d, cpu::where);
  r.add(op::clamp, d, cpu::clamp);
  r.add(op::reduce, d, cpu::reduce);
  r.add(op::variance, d, cpu::variance);
  r.add(op::arg_reduce, d, cpu::arg_reduce);
  r.add(op::gemm, d, cpu::gemm);
  r.add(op::gemm_bias, d, cpu::gemm_bias);
  r.add(op::conv2d_forward, d, cpu::conv2d_forward);
  r.add(op::conv2d_backward, d, cpu::conv2d_backward);
  r.add(op::max_pool2d_forward, d, cpu::max_pool2d_forward);
  r.add(op::max_pool2d_backward, d, cpu::max_pool2d_backward);
  r.add(op::avg_pool2d_forward, d, cpu::avg_pool2d_forward);
  r.add(op::avg_pool2d_backward, d, cpu::avg_pool2d_backward);
  r.add(op::adaptive_avg_pool2d_forward, d, cpu::adaptive_avg_pool2d_forward);
  r.add(op::adaptive_avg_pool2d_backward, d, cpu::adaptive_avg_pool2d_backward);
  r.add(op::batch_norm_forward, d, cpu::batch_norm_forward);
  r.add(op::batch_norm_backward, d, cpu::batch_norm_backward);
  r.add(op::layer_norm_forward, d, cpu::layer_norm_forward);
  r.add(op::layer_norm_backward, d, cpu::layer_norm_backward);
  r.add(op::rms_norm_forward, d, cpu::rms_norm_forward);
  r.add(op::rms_norm_backward, d, cpu::rms_norm_backward);
  r.add(op::softmax_forward, d, cpu::softmax_forward);
  r.add(op::softmax_backward, d, cpu::softmax_backward);
  r.add(op::cross_entropy_forward, d, cpu::cross_entropy_forward);
  r.add(op::cross_entropy_backward, d, cpu::cross_entropy_backward);
  r.add(op::index_select, d, cpu::index_select);
  r.add(op::index_add, d, cpu::index_add);
  r.add(op::gather, d, cpu::gather);
  r.add(op::scatter_add, d, cpu::scatter_add);
  r.add(op::topk, d, cpu::topk);
  r.add(op::adam_step, d, cpu::adam_step);
  r.add(op::sgd_step, d, cpu::sgd_step);
  r.add(op::sum_of_squares, d, cpu::sum_of_squares);
}

}  // namespace kiln::ops
