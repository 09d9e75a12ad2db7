#pragma once
// The FP8 output of a fused CUDA producer (te/fused_ops.h's *Fp8Forward kernels): each value,
// already rounded to the data dtype, is cast with the delayed scale by the same single-precision
// multiply and hardware conversion as ops/cuda/fp8_cast.cu's cast, and its magnitude is folded
// into the tensor's amax (block max, then an atomicMax on the float's bits, which order like the
// non-negative floats), so the bytes and the amax are those of the unfused cast.
#include <cuda_fp8.h>

#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/fp8_scaling.h"
#include "kiln/tensor/fp8_tensor.h"

namespace kiln::te::cuda {

struct Fp8Out {
  std::uint8_t* q = nullptr;
  const float* scale = nullptr;
  float* amax = nullptr;
  float* scale_inv = nullptr;
  bool e4m3 = true;
};

__device__ __forceinline__ float fp8_put(const Fp8Out& o, float scale, std::int64_t i, float v) {
  o.q[i] = static_cast<std::uint8_t>(
      __nv_cvt_float_to_fp8(ops::fp8::mul_rn(v, scale), __NV_SATFINITE, o.e4m3 ? __NV_E4M3 : __NV_E5M2));
  return fabsf(v);
}

// Every thread of the block calls it (block reduction) with its running max.
__device__ __forceinline__ void fp8_finish(const Fp8Out& o, float m, float* shared) {
  m = ops::cuda::block_max(m, shared);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(o.amax), __float_as_uint(m));
  if (blockIdx.x == 0 && threadIdx.x == 0) *o.scale_inv = ops::fp8::reciprocal(*o.scale);
}

// The device pointers of y8, its amax zeroed on `stream` for the atomics.
inline Fp8Out fp8_out(const Fp8Tensor& t, cudaStream_t stream) {
  Fp8Out o;
  o.q = static_cast<std::uint8_t*>(t.data.data_ptr());
  o.scale = static_cast<const float*>(t.scale.data_ptr());
  o.amax = static_cast<float*>(t.amax.data_ptr());
  o.scale_inv = static_cast<float*>(t.scale_inv.data_ptr());
  o.e4m3 = t.dtype() == DType::F8E4M3;
  KILN_CUDA_CHECK(cudaMemsetAsync(o.amax, 0, sizeof(float), stream));
  return o;
}

}  // namespace kiln::te::cuda
