#pragma once
// The rotation of one RoPE channel pair on the GPU, shared by the kernels of apply_rope and
// split_qkv_rope so that both round alike (nvcc contracts a * b - c * d into an FMA the same way
// only for the same expression): the fused op equals the unfused path bit for bit.
#include "kiln/ops/cuda/cuda_common.cuh"

namespace kiln::te::cuda {

// (o1, o2) = (x1 cos - x2 sin, x2 cos + x1 sin) in f32, rounded to T; `sin` carries the direction
// (negated for the backward).
template <class T>
__device__ __forceinline__ void rope_pair(T x1_in, T x2_in, float cos, float sin, T& o1, T& o2) {
  const float x1 = ops::cuda::load_as<float>(x1_in), x2 = ops::cuda::load_as<float>(x2_in);
  o1 = ops::cuda::store_as<T>(x1 * cos - x2 * sin);
  o2 = ops::cuda::store_as<T>(x2 * cos + x1 * sin);
}

}  // namespace kiln::te::cuda
