// CUDA kernel of linear_cross_entropy's chunk step: a block per row reads the row's logits once
// for an online (max, sum of exp) logsumexp in f32, then once more to write the weighted logit
// gradient (softmax - onehot) * weight over them, so a row costs two reads and one write, in
// 16-byte packs where the vocabulary size allows.
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/te/fused_ops.h"

namespace kiln::te::cuda {

using ops::cuda::load_as;
using ops::cuda::store_as;

namespace {

constexpr int kThreads = 512;

// Merges two (max, sum of exp(v - max)) states.
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

// kVec elements per load (16 bytes when the vocabulary and the pointer allow it, else 1).
template <class T, int kVec>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(T* __restrict__ logits, const std::int64_t* __restrict__ labels,
                         const float* __restrict__ row_weight, float* __restrict__ loss, std::int64_t vocab,
                         bool write_grad) {
  using Pack = ops::cuda::Vec<T, kVec>;
  const std::int64_t row = blockIdx.x;
  Pack* z = reinterpret_cast<Pack*>(logits + row * vocab);
  const std::int64_t packs = vocab / kVec;
  const float weight = row_weight[row];
  if (weight == 0.f) {
    if (threadIdx.x == 0) loss[row] = 0.f;
    if (write_grad) {
      Pack zero;
#pragma unroll
      for (int e = 0; e < kVec; ++e) zero.v[e] = store_as<T>(0.f);
      for (std::int64_t j = threadIdx.x; j < packs; j += blockDim.x) z[j] = zero;
    }
    return;
  }
  float m = -INFINITY, s = 0.f;
  for (std::int64_t j = threadIdx.x; j < packs; j += blockDim.x) {
    const Pack pack = z[j];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float v = load_as<float>(pack.v[e]);
      if (v > m) {
        s = s * __expf(m - v) + 1.f;
        m = v;
      } else {
        s += __expf(v - m);
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  __shared__ float sm[32], ss[32];
  __shared__ float lse_shared;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  const std::int64_t label = labels[row];
  if (warp == 0) {
    const int nwarps = blockDim.x >> 5;
    m = lane < nwarps ? sm[lane] : -INFINITY;
    s = lane < nwarps ? ss[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) {
      const float lse = m + __logf(s);
      lse_shared = lse;
      loss[row] = (lse - load_as<float>(logits[row * vocab + label])) * weight;
    }
  }
  __syncthreads();  // the label's logit is read before any thread overwrites the row
  if (!write_grad) return;
  const float lse = lse_shared;
  for (std::int64_t j = threadIdx.x; j < packs; j += blockDim.x) {
    Pack pack = z[j];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float p = __expf(load_as<float>(pack.v[e]) - lse);
      pack.v[e] = store_as<T>((p - (j * kVec + e == label ? 1.f : 0.f)) * weight);
    }
    z[j] = pack;
  }
}

}  // namespace

void cross_entropy_chunk(const Tensor& logits, const Tensor& labels, const Tensor& row_weight, const Tensor& loss,
                         bool write_grad) {
  const std::int64_t rows = logits.shape()[0], vocab = logits.shape()[1];
  ops::cuda::Launch launch(logits);
  KILN_DISPATCH_FLOATING(logits.dtype(), "linear_cross_entropy", [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("linear_cross_entropy: float64 runs on the CPU only");
    } else {
      constexpr int kVec = 16 / sizeof(T);
      const bool packed = vocab % kVec == 0 && ops::cuda::aligned16(logits.data_ptr());
      auto kernel = packed ? cross_entropy_kernel<T, kVec> : cross_entropy_kernel<T, 1>;
      kernel<<<static_cast<unsigned>(rows), kThreads, 0, launch.stream>>>(
          static_cast<T*>(logits.data_ptr()), static_cast<const std::int64_t*>(labels.data_ptr()),
          static_cast<const float*>(row_weight.data_ptr()), static_cast<float*>(loss.data_ptr()), vocab, write_grad);
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace kiln::te::cuda
