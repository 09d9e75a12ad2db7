// CUDA kernels of swiglu: gate and up read from the two halves of the row, f32 math. Where the
// halves' width and the pointers allow, a thread takes 16 bytes of each half at once (8 bf16
// elements: 16-byte loads and stores, and one index division per 8 elements instead of per element);
// otherwise one thread per output element. Both forms compute each element alike, so they agree
// bit for bit.
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/te/cuda/fp8_out.cuh"
#include "kiln/te/fused_ops.h"

namespace kiln::te::cuda {

using ops::cuda::load_as;
using ops::cuda::store_as;

namespace {

__device__ __forceinline__ float swiglu_value(float g, float u) { return g / (1.f + __expf(-g)) * u; }

template <class T>
__global__ void swiglu_forward_kernel(const T* __restrict__ x, std::int64_t total, std::int64_t f,
                                      T* __restrict__ out) {
  for (std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = idx / f, i = idx - r * f;
    const float g = load_as<float>(x[r * 2 * f + i]), u = load_as<float>(x[r * 2 * f + f + i]);
    out[idx] = store_as<T>(swiglu_value(g, u));
  }
}

// The FP8-output form: each output rounded to T, then cast (te/cuda/fp8_out.cuh).
template <class T>
__global__ void swiglu_fp8_forward_kernel(const T* __restrict__ x, std::int64_t total, std::int64_t f, Fp8Out out) {
  __shared__ float shared[32];
  const float s = *out.scale;
  float m = 0.f;
  for (std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = idx / f, i = idx - r * f;
    const float g = load_as<float>(x[r * 2 * f + i]), u = load_as<float>(x[r * 2 * f + f + i]);
    m = fmaxf(m, fp8_put(out, s, idx, load_as<float>(store_as<T>(g / (1.f + __expf(-g)) * u))));
  }
  fp8_finish(out, m, shared);
}

template <class T>
__global__ void swiglu_backward_kernel(const T* __restrict__ dout, const T* __restrict__ x, std::int64_t total,
                                       std::int64_t f, T* __restrict__ dx) {
  for (std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = idx / f, i = idx - r * f;
    const float g = load_as<float>(x[r * 2 * f + i]), u = load_as<float>(x[r * 2 * f + f + i]);
    const float d = load_as<float>(dout[idx]);
    const float sig = 1.f / (1.f + __expf(-g));
    dx[r * 2 * f + i] = store_as<T>(d * u * sig * (1.f + g * (1.f - sig)));
    dx[r * 2 * f + f + i] = store_as<T>(d * g * sig);
  }
}

// N = 16 / sizeof(T) elements per thread; f % N == 0 and every pointer 16-byte aligned.
template <class T, int N>
__global__ void swiglu_forward_vec_kernel(const T* __restrict__ x, std::int64_t vectors, std::int64_t f_vectors,
                                          T* __restrict__ out) {
  using Pack = ops::cuda::Vec<T, N>;
  const auto* xp = reinterpret_cast<const Pack*>(x);
  auto* op = reinterpret_cast<Pack*>(out);
  for (std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < vectors;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = idx / f_vectors, i = idx - r * f_vectors;
    const Pack gate = xp[r * 2 * f_vectors + i], up = xp[r * 2 * f_vectors + f_vectors + i];
    Pack y;
#pragma unroll
    for (int j = 0; j < N; ++j) y.v[j] = store_as<T>(swiglu_value(load_as<float>(gate.v[j]), load_as<float>(up.v[j])));
    op[idx] = y;
  }
}

template <class T, int N>
__global__ void swiglu_backward_vec_kernel(const T* __restrict__ dout, const T* __restrict__ x, std::int64_t vectors,
                                           std::int64_t f_vectors, T* __restrict__ dx) {
  using Pack = ops::cuda::Vec<T, N>;
  const auto* xp = reinterpret_cast<const Pack*>(x);
  const auto* dp = reinterpret_cast<const Pack*>(dout);
  auto* dxp = reinterpret_cast<Pack*>(dx);
  for (std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < vectors;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = idx / f_vectors, i = idx - r * f_vectors;
    const Pack gate = xp[r * 2 * f_vectors + i], up = xp[r * 2 * f_vectors + f_vectors + i], d_out = dp[idx];
    Pack d_gate, d_up;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float g = load_as<float>(gate.v[j]), u = load_as<float>(up.v[j]), d = load_as<float>(d_out.v[j]);
      const float sig = 1.f / (1.f + __expf(-g));
      d_gate.v[j] = store_as<T>(d * u * sig * (1.f + g * (1.f - sig)));
      d_up.v[j] = store_as<T>(d * g * sig);
    }
    dxp[r * 2 * f_vectors + i] = d_gate;
    dxp[r * 2 * f_vectors + f_vectors + i] = d_up;
  }
}

}  // namespace

void swiglu_forward(const Tensor& x, const Tensor& out) {
  const std::int64_t f = out.shape().back(), total = out.numel();
  ops::cuda::Launch launch(x);
  KILN_DISPATCH_FLOATING(x.dtype(), "swiglu", [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("swiglu: float64 runs on the CPU only");
    } else {
      constexpr int n = static_cast<int>(16 / sizeof(T));
      const auto* xp = static_cast<const T*>(x.data_ptr());
      auto* op = static_cast<T*>(out.data_ptr());
      const int threads = 256;
      if (ops::cuda::pack_width<T>(f, {xp, op}) == n) {
        const std::int64_t vectors = total / n;
        swiglu_forward_vec_kernel<T, n>
            <<<ops::cuda::grid_for(vectors, threads, launch.index), threads, 0, launch.stream>>>(xp, vectors, f / n,
                                                                                                 op);
      } else {
        swiglu_forward_kernel<T>
            <<<ops::cuda::grid_for(total, threads, launch.index), threads, 0, launch.stream>>>(xp, total, f, op);
      }
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
}

void swiglu_fp8_forward(const Tensor& x, const Fp8Tensor& out8) {
  const std::int64_t f = out8.cols(), total = out8.data.numel();
  ops::cuda::Launch launch(x);
  const int threads = 256, blocks = ops::cuda::grid_for(total, threads, launch.index);
  KILN_DISPATCH_FLOATING(x.dtype(), "swiglu", [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("swiglu: float64 runs on the CPU only");
    } else {
      const Fp8Out out = fp8_out(out8, launch.stream);
      swiglu_fp8_forward_kernel<T>
          <<<blocks, threads, 0, launch.stream>>>(static_cast<const T*>(x.data_ptr()), total, f, out);
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
}

void swiglu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx) {
  const std::int64_t f = dout.shape().back(), total = dout.numel();
  ops::cuda::Launch launch(x);
  KILN_DISPATCH_FLOATING(x.dtype(), "swiglu_backward", [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("swiglu_backward: float64 runs on the CPU only");
    } else {
      constexpr int n = static_cast<int>(16 / sizeof(T));
      const auto* dp = static_cast<const T*>(dout.data_ptr());
      const auto* xp = static_cast<const T*>(x.data_ptr());
      auto* dxp = static_cast<T*>(dx.data_ptr());
      const int threads = 256;
      if (ops::cuda::pack_width<T>(f, {dp, xp, dxp}) == n) {
        const std::int64_t vectors = total / n;
        swiglu_backward_vec_kernel<T, n>
            <<<ops::cuda::grid_for(vectors, threads, launch.index), threads, 0, launch.stream>>>(dp, xp, vectors, f / n,
                                                                                                 dxp);
      } else {
        swiglu_backward_kernel<T>
            <<<ops::cuda::grid_for(total, threads, launch.index), threads, 0, launch.stream>>>(dp, xp, total, f, dxp);
      }
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace kiln::te::cuda
