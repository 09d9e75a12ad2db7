#include "kiln/ops/cpu/cpu_kernels.h"

namespace kiln::ops {

void register_cpu_kernels(Kernels& k) {
  k.copy = cpu::copy;
  k.fill = cpu::fill;
  k.arange = cpu::arange;
  k.random = cpu::random;
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
  k.augment_images = cpu::augment_images;
}

}  // namespace kiln::ops
