// CUDA kernel of apply_rope: one thread per rotated pair (i, i + R) or passed-through channel of
// each [B, T, H] row, f32 math, the table read from L2 (it is shared by every head and batch). x
// may be strided (unit stride along D: q or k split from a fused projection); out is contiguous.
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/te/cuda/rope_pair.cuh"
#include "kiln/te/fused_ops.h"

namespace kiln::te::cuda {

namespace {

// Work item j < R rotates channels (j, j + R); j >= R copies channel j + R (past the rotary part).
template <class T>
__global__ void rope_kernel(const T* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,
                            std::int64_t rows, std::int64_t t, std::int64_t h, std::int64_t sb, std::int64_t st,
                            std::int64_t sh, int d, int half, std::int64_t position_offset, float sign,
                            T* __restrict__ out) {
  const int items = d - half;
  const std::int64_t total = rows * items;
  for (std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t row = idx / items;  // (b, t, h) flattened
    const int j = static_cast<int>(idx - row * items);
    const std::int64_t hh = row % h, bt = row / h;
    const T* in = x + (bt / t) * sb + (bt % t) * st + hh * sh;
    T* o = out + row * d;
    if (j < half) {
      const std::int64_t pos = position_offset + bt % t;
      const float c = cos[pos * half + j], s = sign * sin[pos * half + j];
      rope_pair(in[j], in[j + half], c, s, o[j], o[j + half]);
    } else {
      o[j + half] = in[j + half];
    }
  }
}

}  // namespace

void apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, std::int64_t position_offset, bool inverse,
                const Tensor& out) {
  const std::int64_t b = x.shape()[0], t = x.shape()[1], h = x.shape()[2], d = x.shape()[3];
  const std::int64_t half = cos.shape()[1];
  ops::cuda::Launch launch(x);
  const std::int64_t total = b * t * h * (d - half);
  const int threads = 256;
  const int blocks = ops::cuda::grid_for(total, threads, launch.index);
  KILN_DISPATCH_FLOATING(x.dtype(), "apply_rope", [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("apply_rope: float64 runs on the CPU only");
    } else {
      rope_kernel<T><<<blocks, threads, 0, launch.stream>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<const float*>(cos.data_ptr()),
          static_cast<const float*>(sin.data_ptr()), b * t * h, t, h, x.stride(0), x.stride(1), x.stride(2),
          static_cast<int>(d), static_cast<int>(half), position_offset, inverse ? -1.f : 1.f,
          static_cast<T*>(out.data_ptr()));
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace kiln::te::cuda
