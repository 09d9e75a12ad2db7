// CUDA kernels of the mixture-of-experts family (te/moe_ops.h). No host synchronisation: the plan
// leaves its offsets on the device and every later kernel reads them there.
//   router:    one thread per token (te/moe_router_math.h, in float).
//   plan:      two kernels of one block per expert: the first counts the expert's slots and marks
//              which it keeps (position policy: a block scan in token order; probs policy: each
//              slot's rank among the expert's slots, a pass over all slots per slot, only for
//              experts over capacity), the second places the kept slots in token order at the
//              expert's offset (the sum of the earlier experts' rows) and writes the padding.
//   gathers:   one thread per element; the unpermute sums a token's k rows (no atomics).
//   grouped GEMM: outside CUDA graph captures the cuBLAS paths of te/cuda/grouped_gemm_cublas.h
//              (after a read-back of the offsets; KILN_GROUPED_GEMM picks grouped, loop or tc).
//              Under capture, or with tc: bf16 / f16 operands whose rows are whole 16-byte chunks go
//              to the tensor-core kernels (te/cuda/grouped_gemm_tc.cu); the rest (f32, odd sizes)
//              to SIMT kernels of 16 x 16 output tiles through shared memory, blocks mapped onto
//              (expert, row tile) by walking the device offsets (te/cuda/grouped_row_tiles.cuh);
//              the SIMT weight gradient one block per (expert, 16 x 16 tile of the weight), looping
//              over the expert's rows.
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/te/cuda/grouped_gemm_cublas.h"
#include "kiln/te/cuda/grouped_gemm_tc.h"
#include "kiln/te/cuda/grouped_row_tiles.cuh"
#include "kiln/te/moe_ops.h"
#include "kiln/te/moe_router_math.h"

namespace kiln::te::cuda {

using ops::cuda::load_as;
using ops::cuda::store_as;

namespace {

constexpr int kPlanThreads = 256;
constexpr int kTile = 16;

__global__ void router_topk_forward_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                                           std::int64_t n, std::int64_t e, RouterTopkParams p, float* probs,
                                           std::int64_t* idx) {
  for (std::int64_t r = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; r < n;
       r += std::int64_t{gridDim.x} * blockDim.x)
    moe_math::router_topk_row<float, float>(logits + r * e, bias, e, p, probs + r * p.topk, idx + r * p.topk);
}

__global__ void router_topk_backward_kernel(const float* __restrict__ dprobs, const float* __restrict__ logits,
                                            const std::int64_t* __restrict__ idx, const float* __restrict__ probs,
                                            std::int64_t n, std::int64_t e, RouterTopkParams p, float* dlogits) {
  for (std::int64_t r = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; r < n;
       r += std::int64_t{gridDim.x} * blockDim.x)
    moe_math::router_topk_backward_row<float, float>(dprobs + r * p.topk, logits + r * e, idx + r * p.topk,
                                                     probs + r * p.topk, e, p, dlogits + r * e);
}

// Exclusive prefix sum of `flag` over the block (kPlanThreads threads); `total` gets the sum.
__device__ int block_exclusive_scan(int flag, int* shared, int* total) {
  const int t = threadIdx.x;
  shared[t] = flag;
  __syncthreads();
  for (int step = 1; step < kPlanThreads; step <<= 1) {
    const int v = t >= step ? shared[t - step] : 0;
    __syncthreads();
    shared[t] += v;
    __syncthreads();
  }
  const int inclusive = shared[t];
  *total = shared[kPlanThreads - 1];
  __syncthreads();
  return inclusive - flag;
}

// Block e: tokens[e], dropped[e], and row_of[s] = 1 (kept) or -1 (dropped) for e's slots s.
__global__ void plan_mark_kernel(const std::int64_t* __restrict__ idx, const float* __restrict__ probs,
                                 std::int64_t slots, std::int64_t capacity, bool drop_by_position, std::int64_t* row_of,
                                 std::int64_t* tokens, std::int64_t* dropped) {
  __shared__ int scan[kPlanThreads];
  __shared__ double red[32];
  const std::int64_t e = blockIdx.x;
  double mine = 0;
  for (std::int64_t s = threadIdx.x; s < slots; s += blockDim.x) mine += idx[s] == e ? 1.0 : 0.0;
  const auto count = static_cast<std::int64_t>(ops::cuda::block_sum(mine, red));
  const bool limited = capacity > 0 && count > capacity;
  std::int64_t base = 0;  // position policy: e's slots before this chunk
  for (std::int64_t start = 0; start < slots; start += kPlanThreads) {
    const std::int64_t s = start + threadIdx.x;
    const bool is_mine = s < slots && idx[s] == e;
    int chunk_total = 0;
    std::int64_t rank = 0;
    if (limited && drop_by_position) {
      rank = base + block_exclusive_scan(is_mine ? 1 : 0, scan, &chunk_total);
      base += chunk_total;
    }
    if (!is_mine) continue;
    bool keep = true;
    if (limited && !drop_by_position) {
      const float ps = probs[s];
      for (std::int64_t o = 0; o < slots; ++o)
        if (idx[o] == e && (probs[o] > ps || (probs[o] == ps && o < s))) ++rank;
    }
    if (limited) keep = rank < capacity;
    row_of[s] = keep ? 1 : -1;
  }
  if (threadIdx.x == 0) {
    tokens[e] = count;
    dropped[e] = limited ? count - capacity : 0;
  }
}

// Block e: e's offset, the rows of its kept slots (token order), its padding; the last block also
// offsets[E] and the unused tail.
__global__ void plan_place_kernel(std::int64_t slots, std::int64_t k, std::int64_t e_count, std::int64_t rows,
                                  std::int64_t capacity, bool pad, const std::int64_t* __restrict__ idx,
                                  const std::int64_t* __restrict__ tokens, const std::int64_t* __restrict__ dropped,
                                  std::int64_t* src, std::int64_t* row_of, std::int64_t* offsets) {
  __shared__ int scan[kPlanThreads];
  const std::int64_t e = blockIdx.x;
  auto rows_of = [&](std::int64_t x) { return pad ? capacity : tokens[x] - dropped[x]; };
  std::int64_t base = 0;
  for (std::int64_t x = 0; x < e; ++x) base += rows_of(x);
  const std::int64_t kept = tokens[e] - dropped[e];
  std::int64_t placed = 0;
  for (std::int64_t start = 0; start < slots; start += kPlanThreads) {
    const std::int64_t s = start + threadIdx.x;
    const bool take = s < slots && idx[s] == e && row_of[s] == 1;
    int chunk_total = 0;
    const int before = block_exclusive_scan(take ? 1 : 0, scan, &chunk_total);
    if (take) {
      const std::int64_t r = base + placed + before;
      src[r] = s / k;
      row_of[s] = r;
    }
    placed += chunk_total;
  }
  for (std::int64_t i = kept + threadIdx.x; i < rows_of(e); i += blockDim.x) src[base + i] = -1;
  if (threadIdx.x == 0) offsets[e] = base;
  if (e == e_count - 1) {
    const std::int64_t used = base + rows_of(e);
    if (threadIdx.x == 0) offsets[e_count] = used;
    for (std::int64_t r = used + threadIdx.x; r < rows; r += blockDim.x) src[r] = -1;
  }
}

template <class T>
__global__ void permute_kernel(const T* __restrict__ x, const std::int64_t* __restrict__ src, std::int64_t total,
                               std::int64_t h, T* out) {
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = i / h, c = i - r * h, s = src[r];
    out[i] = s < 0 ? store_as<T>(0.f) : x[s * h + c];
  }
}

template <class T>
__global__ void unpermute_kernel(const T* __restrict__ in, const std::int64_t* __restrict__ row_of,
                                 const float* __restrict__ probs, std::int64_t total, std::int64_t h, std::int64_t k,
                                 T* out) {
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t t = i / h, c = i - t * h;
    float acc = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t r = row_of[t * k + j];
      if (r >= 0) acc += (probs ? probs[t * k + j] : 1.f) * load_as<float>(in[r * h + c]);
    }
    out[i] = store_as<T>(acc);
  }
}

// din[row_of[t, j]] = probs[t, j] dout[t]; din is zeroed before.
template <class T>
__global__ void unpermute_backward_data_kernel(const T* __restrict__ dout, const std::int64_t* __restrict__ row_of,
                                               const float* __restrict__ probs, std::int64_t total, std::int64_t h,
                                               std::int64_t k, T* din) {
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t slot = i / h, c = i - slot * h, t = slot / k, r = row_of[slot];
    if (r >= 0) din[r * h + c] = store_as<T>((probs ? probs[slot] : 1.f) * load_as<float>(dout[t * h + c]));
  }
}

// dprobs[slot] = <in[row_of[slot]], dout[t]>, one warp per slot.
template <class T>
__global__ void unpermute_backward_probs_kernel(const T* __restrict__ dout, const T* __restrict__ in,
                                                const std::int64_t* __restrict__ row_of, std::int64_t slots,
                                                std::int64_t h, std::int64_t k, float* dprobs) {
  const std::int64_t warps = (std::int64_t{gridDim.x} * blockDim.x) >> 5;
  const int lane = threadIdx.x & 31;
  for (std::int64_t slot = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5; slot < slots; slot += warps) {
    const std::int64_t r = row_of[slot], t = slot / k;
    float acc = 0;
    if (r >= 0)
      for (std::int64_t c = lane; c < h; c += 32)
        acc += load_as<float>(in[r * h + c]) * load_as<float>(dout[t * h + c]);
    acc = ops::cuda::warp_sum(acc);
    if (lane == 0) dprobs[slot] = acc;
  }
}

// y[r, o] = sum_c x[r, c] W_e(o, c) with W_e(o, c) = w[e, o, c] (trans_w false, w [E, O, K]) or
// w[e, c, o] (trans_w true, w [E, K, O]).
template <class T>
__global__ void grouped_gemm_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                    const std::int64_t* __restrict__ offsets, std::int64_t e_count, std::int64_t rows,
                                    std::int64_t kdim, std::int64_t odim, bool trans_w, T* y) {
  __shared__ float xs[kTile][kTile + 1];
  __shared__ float ws[kTile][kTile + 1];
  std::int64_t expert = 0, row0 = 0, row_end = 0;
  if (!tile_of_block<kTile>(blockIdx.x, offsets, e_count, rows, &expert, &row0, &row_end)) return;
  const int tr = threadIdx.y, tc = threadIdx.x;
  const std::int64_t r = row0 + tr, o = std::int64_t{blockIdx.y} * kTile + tc;
  if (expert < 0) {
    if (r < row_end && o < odim) y[r * odim + o] = store_as<T>(0.f);
    return;
  }
  const T* we = w + expert * odim * kdim;
  const std::int64_t o_load = std::int64_t{blockIdx.y} * kTile + tr;  // the weight tile is loaded by (o, c)
  float acc = 0;
  for (std::int64_t c0 = 0; c0 < kdim; c0 += kTile) {
    const std::int64_t c = c0 + tc;
    xs[tr][tc] = r < row_end && c < kdim ? load_as<float>(x[r * kdim + c]) : 0.f;
    ws[tr][tc] =
        o_load < odim && c < kdim ? load_as<float>(trans_w ? we[c * odim + o_load] : we[o_load * kdim + c]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile; ++i) acc += xs[tr][i] * ws[tc][i];
    __syncthreads();
  }
  if (r < row_end && o < odim) y[r * odim + o] = store_as<T>(acc);
}

// dw[e, o, c] = sum over e's rows of dy[r, o] x[r, c]; block (c tile, o tile, e).
template <class T>
__global__ void grouped_gemm_wgrad_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                          const std::int64_t* __restrict__ offsets, std::int64_t kdim,
                                          std::int64_t odim, T* dw) {
  __shared__ float ds[kTile][kTile + 1];
  __shared__ float xs[kTile][kTile + 1];
  const std::int64_t e = blockIdx.z, lo = offsets[e], hi = offsets[e + 1];
  const int ty = threadIdx.y, tx = threadIdx.x;
  const std::int64_t o = std::int64_t{blockIdx.y} * kTile + ty, c = std::int64_t{blockIdx.x} * kTile + tx;
  const std::int64_t o_load = std::int64_t{blockIdx.y} * kTile + tx;  // dy tile loaded as (row, o)
  float acc = 0;
  for (std::int64_t r0 = lo; r0 < hi; r0 += kTile) {
    const std::int64_t r = r0 + ty;
    ds[ty][tx] = r < hi && o_load < odim ? load_as<float>(dy[r * odim + o_load]) : 0.f;
    xs[ty][tx] = r < hi && c < kdim ? load_as<float>(x[r * kdim + c]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile; ++i) acc += ds[i][ty] * xs[i][tx];
    __syncthreads();
  }
  if (o < odim && c < kdim) dw[(e * odim + o) * kdim + c] = store_as<T>(acc);
}

template <class F>
void dispatch_low(DType dtype, const char* op, F&& f) {
  KILN_DISPATCH_FLOATING(dtype, op, [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("{}: float64 runs on the CPU only", op);
    } else {
      f.template operator()<T>();
    }
  });
}

}  // namespace

void router_topk_forward(const Tensor& logits, const Tensor& expert_bias, const RouterTopkParams& p,
                         const Tensor& probs, const Tensor& indices) {
  const std::int64_t n = logits.shape()[0], e = logits.shape()[1];
  if (n == 0) return;
  ops::cuda::Launch launch(logits);
  const int threads = 128, blocks = ops::cuda::grid_for(n, threads, launch.index);
  router_topk_forward_kernel<<<blocks, threads, 0, launch.stream>>>(
      static_cast<const float*>(logits.data_ptr()),
      expert_bias.defined() ? static_cast<const float*>(expert_bias.data_ptr()) : nullptr, n, e, p,
      static_cast<float*>(probs.data_ptr()), static_cast<std::int64_t*>(indices.data_ptr()));
  KILN_CUDA_CHECK_LAUNCH();
}

void router_topk_backward(const Tensor& dprobs, const Tensor& logits, const Tensor& indices, const Tensor& probs,
                          const RouterTopkParams& p, const Tensor& dlogits) {
  const std::int64_t n = logits.shape()[0], e = logits.shape()[1];
  if (n == 0) return;
  ops::cuda::Launch launch(logits);
  const int threads = 128, blocks = ops::cuda::grid_for(n, threads, launch.index);
  router_topk_backward_kernel<<<blocks, threads, 0, launch.stream>>>(
      static_cast<const float*>(dprobs.data_ptr()), static_cast<const float*>(logits.data_ptr()),
      static_cast<const std::int64_t*>(indices.data_ptr()), static_cast<const float*>(probs.data_ptr()), n, e, p,
      static_cast<float*>(dlogits.data_ptr()));
  KILN_CUDA_CHECK_LAUNCH();
}

void moe_dispatch_plan(const Tensor& indices, const Tensor& probs, std::int64_t capacity, bool pad,
                       bool drop_by_position, const Tensor& src_token, const Tensor& row_of, const Tensor& offsets,
                       const Tensor& tokens, const Tensor& dropped) {
  const std::int64_t slots = indices.numel(), k = indices.shape()[1], e_count = tokens.numel();
  ops::cuda::Launch launch(indices);
  const auto* idx = static_cast<const std::int64_t*>(indices.data_ptr());
  auto* row = static_cast<std::int64_t*>(row_of.data_ptr());
  auto* tok = static_cast<std::int64_t*>(tokens.data_ptr());
  auto* drop = static_cast<std::int64_t*>(dropped.data_ptr());
  plan_mark_kernel<<<static_cast<unsigned>(e_count), kPlanThreads, 0, launch.stream>>>(
      idx, static_cast<const float*>(probs.data_ptr()), slots, capacity, drop_by_position, row, tok, drop);
  KILN_CUDA_CHECK_LAUNCH();
  plan_place_kernel<<<static_cast<unsigned>(e_count), kPlanThreads, 0, launch.stream>>>(
      slots, k, e_count, src_token.numel(), capacity, pad, idx, tok, drop,
      static_cast<std::int64_t*>(src_token.data_ptr()), row, static_cast<std::int64_t*>(offsets.data_ptr()));
  KILN_CUDA_CHECK_LAUNCH();
}

void moe_permute(const Tensor& x, const Tensor& src_token, const Tensor& out) {
  const std::int64_t h = x.shape()[1], total = out.numel();
  if (total == 0) return;
  ops::cuda::Launch launch(x);
  const int threads = 256, blocks = ops::cuda::grid_for(total, threads, launch.index);
  dispatch_low(x.dtype(), "moe_permute", [&]<class T>() {
    permute_kernel<T><<<blocks, threads, 0, launch.stream>>>(static_cast<const T*>(x.data_ptr()),
                                                             static_cast<const std::int64_t*>(src_token.data_ptr()),
                                                             total, h, static_cast<T*>(out.data_ptr()));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void moe_unpermute(const Tensor& in, const Tensor& row_of, const Tensor& probs, const Tensor& out) {
  const std::int64_t h = in.shape()[1], k = row_of.shape()[1], total = out.numel();
  if (total == 0) return;
  ops::cuda::Launch launch(in);
  const int threads = 256, blocks = ops::cuda::grid_for(total, threads, launch.index);
  dispatch_low(in.dtype(), "moe_unpermute", [&]<class T>() {
    unpermute_kernel<T><<<blocks, threads, 0, launch.stream>>>(
        static_cast<const T*>(in.data_ptr()), static_cast<const std::int64_t*>(row_of.data_ptr()),
        probs.defined() ? static_cast<const float*>(probs.data_ptr()) : nullptr, total, h, k,
        static_cast<T*>(out.data_ptr()));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void moe_unpermute_backward(const Tensor& dout, const Tensor& in, const Tensor& row_of, const Tensor& probs,
                            const Tensor& din, const Tensor& dprobs) {
  const std::int64_t h = in.shape()[1], k = row_of.shape()[1], slots = row_of.numel();
  ops::cuda::Launch launch(in);
  const std::size_t din_bytes = static_cast<std::size_t>(din.numel()) * dtype_size(din.dtype());
  if (din_bytes > 0) KILN_CUDA_CHECK(cudaMemsetAsync(din.data_ptr(), 0, din_bytes, launch.stream));
  if (slots == 0) return;
  dispatch_low(in.dtype(), "moe_unpermute_backward", [&]<class T>() {
    const auto* row = static_cast<const std::int64_t*>(row_of.data_ptr());
    const float* pp = probs.defined() ? static_cast<const float*>(probs.data_ptr()) : nullptr;
    const int threads = 256;
    if (h > 0) {
      const std::int64_t total = slots * h;
      unpermute_backward_data_kernel<T>
          <<<ops::cuda::grid_for(total, threads, launch.index), threads, 0, launch.stream>>>(
              static_cast<const T*>(dout.data_ptr()), row, pp, total, h, k, static_cast<T*>(din.data_ptr()));
      KILN_CUDA_CHECK_LAUNCH();
    }
    if (dprobs.defined()) {
      unpermute_backward_probs_kernel<T>
          <<<ops::cuda::grid_for(slots * 32, threads, launch.index), threads, 0, launch.stream>>>(
              static_cast<const T*>(dout.data_ptr()), static_cast<const T*>(in.data_ptr()), row, slots, h, k,
              static_cast<float*>(dprobs.data_ptr()));
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
}

void grouped_gemm(const Tensor& x, const Tensor& w, const Tensor& offsets, bool trans_w, const Tensor& y) {
  const std::int64_t rows = x.shape()[0], kdim = x.shape()[1], odim = y.shape()[1], e_count = w.shape()[0];
  if (rows == 0 || odim == 0) return;
  ops::cuda::Launch launch(x);
  if (grouped_gemm_cublas(x, w, offsets, trans_w, y)) return;  // outside graph captures (see its header)
  if (grouped_gemm_tc_supported(x, w, y)) return grouped_gemm_tc(x, w, offsets, trans_w, y);
  const dim3 grid(static_cast<unsigned>(grouped_row_tile_blocks(rows, e_count, kTile)),
                  static_cast<unsigned>((odim + kTile - 1) / kTile));
  const dim3 block(kTile, kTile);
  dispatch_low(x.dtype(), "grouped_gemm", [&]<class T>() {
    grouped_gemm_kernel<T>
        <<<grid, block, 0, launch.stream>>>(static_cast<const T*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()),
                                            static_cast<const std::int64_t*>(offsets.data_ptr()), e_count, rows, kdim,
                                            odim, trans_w, static_cast<T*>(y.data_ptr()));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void grouped_gemm_wgrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dw) {
  const std::int64_t e_count = dw.shape()[0], odim = dw.shape()[1], kdim = dw.shape()[2];
  if (dw.numel() == 0) return;
  if (grouped_gemm_wgrad_cublas(dy, x, offsets, dw)) return;
  if (grouped_gemm_tc_supported(x, dy, dw)) return grouped_gemm_wgrad_tc(dy, x, offsets, dw);
  ops::cuda::Launch launch(x);
  const dim3 grid(static_cast<unsigned>((kdim + kTile - 1) / kTile), static_cast<unsigned>((odim + kTile - 1) / kTile),
                  static_cast<unsigned>(e_count));
  const dim3 block(kTile, kTile);
  dispatch_low(x.dtype(), "grouped_gemm_wgrad", [&]<class T>() {
    grouped_gemm_wgrad_kernel<T><<<grid, block, 0, launch.stream>>>(
        static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()),
        static_cast<const std::int64_t*>(offsets.data_ptr()), kdim, odim, static_cast<T*>(dw.data_ptr()));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace kiln::te::cuda
