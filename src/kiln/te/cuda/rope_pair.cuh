#pragma once
// The rotation of one RoPE channel pair on the GPU, shared by the kernels of apply_rope and
// split_qkv_rope. The products and the sum are rounded one by one (__fmul_rn / __fadd_rn, which nvcc
// never contracts into an FMA): left to itself nvcc fuses a * b - c * d differently in the two
// kernels (seen on an H100: 1 f32 ulp apart), so the fused op would not equal the unfused path bit
// for bit; rounded so, both also compute what the CPU kernel computes.
#include "kiln/ops/cuda/cuda_common.cuh"

namespace kiln::te::cuda {

// (o1, o2) = (x1 cos - x2 sin, x2 cos + x1 sin) in f32, rounded to T; `sin` carries the direction
// (negated for the backward).
template <class T>
__device__ __forceinline__ void rope_pair(T x1_in, T x2_in, float cos, float sin, T& o1, T& o2) {
  const float x1 = ops::cuda::load_as<float>(x1_in), x2 = ops::cuda::load_as<float>(x2_in);
  o1 = ops::cuda::store_as<T>(__fsub_rn(__fmul_rn(x1, cos), __fmul_rn(x2, sin)));
  o2 = ops::cuda::store_as<T>(__fadd_rn(__fmul_rn(x2, cos), __fmul_rn(x1, sin)));
}

}  // namespace kiln::te::cuda
