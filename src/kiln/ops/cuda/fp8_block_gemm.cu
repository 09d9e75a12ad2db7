// Kiln's own block-scaled FP8 GEMM, for what cuBLASLt does not run: 128x128 x 128x128 (cuBLASLt
// has 1x128 x 1x128, 1x128 x 128x128 and 128x128 x 1x128 only) and block scaling on GPUs other
// than Hopper or with a cuBLASLt older than 12.9. It is a plain CUDA-core kernel: correct for every
// layout pair, not fast (tensor-core FP8 is cuBLASLt's job); fp8_gemm.cpp routes to it only when
// cuBLASLt cannot take the problem.
//
// out[m, n] = sum over K blocks kb of (sum_{k in kb} a[m, k] b[n, k]) * sa(m, kb) * sb(n, kb):
// each 32-wide K chunk lies inside one 128-wide scaling block, so a chunk's partial dot products
// are scaled once and added to an f32 accumulator (the same promotion cuBLASLt's kernels do).
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/fp8_cuda.h"

namespace kiln::ops::cuda {

namespace {

constexpr int kTile = 64;   // output tile kTile x kTile per CTA
constexpr int kChunk = 32;  // K per shared-memory stage (divides 128)
constexpr int kThreads = 256;

struct Operand {
  const std::uint8_t* data;
  const float* scale_inv;
  ScalingLayout layout;
  std::int64_t ld;  // the scale tensor's row length
  bool e4m3;
};

__device__ __forceinline__ float decode(std::uint8_t b, bool e4m3) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, e4m3 ? __NV_E4M3 : __NV_E5M2)));
}

// The scale_inv of row `r` (of a [rows, K] operand) in K block kb.
__device__ __forceinline__ float scale_of(const Operand& o, std::int64_t r, std::int64_t kb) {
  return o.layout == ScalingLayout::Block1x128 ? o.scale_inv[kb * o.ld + r] : o.scale_inv[(r >> 7) * o.ld + kb];
}

template <class Out>
__global__ void __launch_bounds__(kThreads)
    block_gemm_kernel(Operand a, Operand b, std::int64_t M, std::int64_t N, std::int64_t K, const BFloat16* bias,
                      bool accumulate, Out* out) {
  __shared__ float as[kChunk][kTile + 1];  // as[k][m]: a tile, transposed for conflict-free reads
  __shared__ float bs[kChunk][kTile + 1];
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.y) * kTile,
                     n0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  const int tm = threadIdx.x / 16, tn = threadIdx.x % 16;  // 16 x 16 threads, 4 x 4 outputs each
  float acc[4][4] = {};
  for (std::int64_t k0 = 0; k0 < K; k0 += kChunk) {
    // Load and decode: 64 rows x 32 k of each operand, 8 elements per thread.
    for (int i = threadIdx.x; i < kTile * kChunk; i += kThreads) {
      const int r = i / kChunk, k = i % kChunk;
      const std::int64_t gk = k0 + k;
      const std::int64_t gm = m0 + r, gn = n0 + r;
      as[k][r] = (gm < M && gk < K) ? decode(a.data[gm * K + gk], a.e4m3) : 0.0f;
      bs[k][r] = (gn < N && gk < K) ? decode(b.data[gn * K + gk], b.e4m3) : 0.0f;
    }
    __syncthreads();
    float part[4][4] = {};
#pragma unroll 8
    for (int k = 0; k < kChunk; ++k) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        av[i] = as[k][tm * 4 + i];
        bv[i] = bs[k][tn * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) part[i][j] = fmaf(av[i], bv[j], part[i][j]);
    }
    const std::int64_t kb = k0 / 128;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const std::int64_t gm = m0 + tm * 4 + i;
      const float sa = gm < M ? scale_of(a, gm, kb) : 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::int64_t gn = n0 + tn * 4 + j;
        const float sb = gn < N ? scale_of(b, gn, kb) : 0.0f;
        acc[i][j] = fmaf(part[i][j], sa * sb, acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::int64_t gm = m0 + tm * 4 + i;
    if (gm >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t gn = n0 + tn * 4 + j;
      if (gn >= N) continue;
      float v = acc[i][j];
      if (bias) v += to_float(bias[gn]);
      if (accumulate) v += to_float(out[gm * N + gn]);  // float32 only (the wrapper checks)
      out[gm * N + gn] = store_as<Out>(v);
    }
  }
}

Operand operand(const Fp8Tensor& t) {
  return {static_cast<const std::uint8_t*>(t.data.data_ptr()), static_cast<const float*>(t.scale_inv.data_ptr()),
          t.layout, t.scale_inv.shape()[1], t.dtype() == DType::F8E4M3};
}

}  // namespace

void fp8_block_gemm_kiln(const Fp8GemmArgs& g) {
  Launch l(g.out);
  const std::int64_t M = g.a->rows(), N = g.b->rows(), K = g.a->cols();
  const dim3 grid(static_cast<unsigned>((N + kTile - 1) / kTile), static_cast<unsigned>((M + kTile - 1) / kTile));
  const auto* bias = g.bias.defined() ? static_cast<const BFloat16*>(g.bias.data_ptr()) : nullptr;
  if (g.out.dtype() == DType::F32)
    block_gemm_kernel<float><<<grid, kThreads, 0, l.stream>>>(operand(*g.a), operand(*g.b), M, N, K, bias, g.accumulate,
                                                              static_cast<float*>(g.out.data_ptr()));
  else
    block_gemm_kernel<BFloat16><<<grid, kThreads, 0, l.stream>>>(
        operand(*g.a), operand(*g.b), M, N, K, bias, g.accumulate, static_cast<BFloat16*>(g.out.data_ptr()));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::ops::cuda
