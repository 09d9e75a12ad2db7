// CUDA kernels of swiglu: one thread per output element (gate and up read from the two halves of
// the row), f32 math.
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/te/cuda/fp8_out.cuh"
#include "kiln/te/fused_ops.h"

namespace kiln::te::cuda {

using ops::cuda::load_as;
using ops::cuda::store_as;

namespace {

template <class T>
__global__ void swiglu_forward_kernel(const T* __restrict__ x, std::int64_t total, std::int64_t f,
                                      T* __restrict__ out) {
  for (std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = idx / f, i = idx - r * f;
    const float g = load_as<float>(x[r * 2 * f + i]), u = load_as<float>(x[r * 2 * f + f + i]);
    out[idx] = store_as<T>(g / (1.f + __expf(-g)) * u);
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

}  // namespace

void swiglu_forward(const Tensor& x, const Tensor& out) {
  const std::int64_t f = out.shape().back(), total = out.numel();
  ops::cuda::Launch launch(x);
  const int threads = 256, blocks = ops::cuda::grid_for(total, threads, launch.index);
  KILN_DISPATCH_FLOATING(x.dtype(), "swiglu", [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("swiglu: float64 runs on the CPU only");
    } else {
      swiglu_forward_kernel<T><<<blocks, threads, 0, launch.stream>>>(static_cast<const T*>(x.data_ptr()), total, f,
                                                                      static_cast<T*>(out.data_ptr()));
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
  const int threads = 256, blocks = ops::cuda::grid_for(total, threads, launch.index);
  KILN_DISPATCH_FLOATING(x.dtype(), "swiglu_backward", [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("swiglu_backward: float64 runs on the CPU only");
    } else {
      swiglu_backward_kernel<T><<<blocks, threads, 0, launch.stream>>>(static_cast<const T*>(dout.data_ptr()),
                                                                       static_cast<const T*>(x.data_ptr()), total, f,
                                                                       static_cast<T*>(dx.data_ptr()));
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace kiln::te::cuda
