// CUDA kernels of attention_backward (FlashAttention-2's backward). First D_i = rowsum(dO_i * O_i)
// per query row; then the probabilities P are recomputed from the saved logsumexp, tile by tile:
// dV = P^T dO, dP = dO V^T, dS = P * (dP - D), dQ = scale dS K, dK = scale dS^T Q.
// With attention dropout the same Philox mask as the forward's is regenerated (KernelSizes::keep):
// dV takes the dropped probabilities (P M / (1 - p)) and dP is masked and scaled likewise before
// dS; D = rowsum(dO * O) needs no change (sum_j P_ij dP_ij = dO_i . O_i with O the dropped output).
//
// Tensor-core path (bfloat16 / float16, head dim 64 or 128): a block of 4 warps owns 64 keys of one
// (batch, key/value head) and walks the query tiles of every query head of its group (so dK and
// dV, held in WMMA accumulator fragments for the whole walk, sum the group's heads with no atomics);
// query tiles wholly before the causal diagonal are skipped. dQ gets each block's 64-key
// contribution by float atomics into a float buffer, scaled and cast at the end.
// SIMT path (every other call): one kernel computes dQ with a warp per query row, another dK and dV
// with a warp per key row; both recompute P, and neither needs atomics.
#include <mma.h>

#include <algorithm>

#include "kiln/te/attention_kernels.h"
#include "kiln/te/cuda/attention_common.cuh"
#include "kiln/te/cuda/attention_cudnn.h"

namespace kiln::te::cuda {

namespace {

// D_i = sum_d dO[i, d] * O[i, d], one warp per (b, i, h) row; written to delta[(b, h), i].
template <class T, class A>
__global__ void __launch_bounds__(256)
    delta_kernel(const T* __restrict__ grad_out, const T* __restrict__ out, A* __restrict__ delta, KernelSizes p) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t rows = p.batch * p.q_len * p.q_heads;
  if (row >= rows) return;
  const T* g = grad_out + row * p.head_dim;
  const T* o = out + row * p.head_dim;
  A acc = 0;
  for (std::int64_t d = lane; d < p.head_dim; d += 32) acc += load_acc<A>(g[d]) * load_acc<A>(o[d]);
  acc = warp_sum(acc);
  const std::int64_t h = row % p.q_heads, i = (row / p.q_heads) % p.q_len, b = row / (p.q_heads * p.q_len);
  if (lane == 0) delta[(b * p.q_heads + h) * p.q_len + i] = acc;
}

// ---- SIMT -----------------------------------------------------------------------------------------

template <class T, class A>
__global__ void __launch_bounds__(kSimtWarps * 32)
    grad_q_simt_kernel(const T* __restrict__ grad_out, const T* __restrict__ q, const T* __restrict__ k,
                       const T* __restrict__ v, const A* __restrict__ lse, const A* __restrict__ delta,
                       T* __restrict__ grad_q, KernelSizes p) {
  constexpr int kChunks = kMaxHeadDim / 32;
  __shared__ A q_rows[kSimtWarps][kMaxHeadDim], do_rows[kSimtWarps][kMaxHeadDim];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kSimtWarps + warp;
  const std::int64_t bh = blockIdx.y, b = bh / p.q_heads, h = bh % p.q_heads, hk = h / p.group;
  if (i >= p.q_len) return;
  const int D = static_cast<int>(p.head_dim);
  const A scale = static_cast<A>(p.scale);
  const std::int64_t qoff = p.row(b, i, p.q_len, p.q_heads, h);
  for (int d = lane; d < D; d += 32) {
    q_rows[warp][d] = load_acc<A>(q[qoff + d]);
    do_rows[warp][d] = load_acc<A>(grad_out[qoff + d]);
  }
  __syncwarp();
  const A row_lse = lse[bh * p.q_len + i], row_delta = delta[bh * p.q_len + i];
  const std::int64_t kend = min(max(p.last_key(i) + 1, std::int64_t{0}), p.kv_len);
  const std::uint64_t drop_base = p.dropout ? p.dropout_base() : 0;
  A dq[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) dq[c] = 0;
  for (std::int64_t j0 = 0; j0 < kend; j0 += 32) {
    const std::int64_t j = j0 + lane;
    A ds = 0;
    if (j < kend) {
      const T* krow = k + p.row(b, j, p.kv_len, p.kv_heads, hk);
      const T* vrow = v + p.row(b, j, p.kv_len, p.kv_heads, hk);
      A s = 0, dp = 0;
      for (int d = 0; d < D; ++d) {
        s += q_rows[warp][d] * load_acc<A>(krow[d]);
        dp += do_rows[warp][d] * load_acc<A>(vrow[d]);
      }
      // Dropout: the kept probability's factor (0 when dropped) on dP.
      if (p.dropout) dp = p.keep(drop_base, b, h, i, j) ? dp * static_cast<A>(p.dropout_scale) : A(0);
      ds = exp_acc(s * scale - row_lse) * (dp - row_delta);
    }
    const int n = kend - j0 < 32 ? static_cast<int>(kend - j0) : 32;
    for (int jj = 0; jj < n; ++jj) {
      const A w = __shfl_sync(0xffffffffu, ds, jj);
      const T* krow = k + p.row(b, j0 + jj, p.kv_len, p.kv_heads, hk);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < D) dq[c] += w * load_acc<A>(krow[d]);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int d = lane + 32 * c;
    if (d < D) grad_q[qoff + d] = store_from<T>(dq[c] * scale);
  }
}

template <class T, class A>
__global__ void __launch_bounds__(kSimtWarps * 32)
    grad_kv_simt_kernel(const T* __restrict__ grad_out, const T* __restrict__ q, const T* __restrict__ k,
                        const T* __restrict__ v, const A* __restrict__ lse, const A* __restrict__ delta,
                        T* __restrict__ grad_k, T* __restrict__ grad_v, KernelSizes p) {
  constexpr int kChunks = kMaxHeadDim / 32;
  __shared__ A k_rows[kSimtWarps][kMaxHeadDim], v_rows[kSimtWarps][kMaxHeadDim];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kSimtWarps + warp;
  const std::int64_t bhk = blockIdx.y, b = bhk / p.kv_heads, hk = bhk % p.kv_heads;
  if (j >= p.kv_len) return;
  const int D = static_cast<int>(p.head_dim);
  const A scale = static_cast<A>(p.scale);
  const std::int64_t koff = p.row(b, j, p.kv_len, p.kv_heads, hk);
  for (int d = lane; d < D; d += 32) {
    k_rows[warp][d] = load_acc<A>(k[koff + d]);
    v_rows[warp][d] = load_acc<A>(v[koff + d]);
  }
  __syncwarp();
  // The first query that sees key j: last_key(i) >= j.
  const std::int64_t first = p.causal ? max(j - (p.kv_len - p.q_len), std::int64_t{0}) : 0;
  const std::uint64_t drop_base = p.dropout ? p.dropout_base() : 0;
  A dk[kChunks], dv[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) dk[c] = dv[c] = 0;
  for (std::int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    const std::int64_t bh = b * p.q_heads + h;
    for (std::int64_t i0 = first; i0 < p.q_len; i0 += 32) {
      const std::int64_t i = i0 + lane;
      A pr = 0, ds = 0;
      if (i < p.q_len) {
        const std::int64_t qoff = p.row(b, i, p.q_len, p.q_heads, h);
        A s = 0, dp = 0;
        for (int d = 0; d < D; ++d) {
          s += load_acc<A>(q[qoff + d]) * k_rows[warp][d];
          dp += load_acc<A>(grad_out[qoff + d]) * v_rows[warp][d];
        }
        pr = exp_acc(s * scale - lse[bh * p.q_len + i]);
        // Dropout: the kept probability's factor (0 when dropped) on dP and on dV's probability.
        const A keep = !p.dropout ? A(1) : p.keep(drop_base, b, h, i, j) ? static_cast<A>(p.dropout_scale) : A(0);
        ds = pr * (dp * keep - delta[bh * p.q_len + i]);
        pr *= keep;
      }
      const int n = p.q_len - i0 < 32 ? static_cast<int>(p.q_len - i0) : 32;
      for (int ii = 0; ii < n; ++ii) {
        const A wp = __shfl_sync(0xffffffffu, pr, ii), ws = __shfl_sync(0xffffffffu, ds, ii);
        const std::int64_t qoff = p.row(b, i0 + ii, p.q_len, p.q_heads, h);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int d = lane + 32 * c;
          if (d < D) {
            dv[c] += wp * load_acc<A>(grad_out[qoff + d]);
            dk[c] += ws * load_acc<A>(q[qoff + d]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int d = lane + 32 * c;
    if (d < D) {
      grad_k[koff + d] = store_from<T>(dk[c] * scale);
      grad_v[koff + d] = store_from<T>(dv[c]);
    }
  }
}

// ---- tensor cores -----------------------------------------------------------------------------------

template <int D>
struct BackwardSmem {
  static constexpr int kLd = D + kPad16;          // K, V, Q, dO rows
  static constexpr int kLdS = kTcCols + kPadF32;  // per-warp float scratch (S^T, then dP^T)
  static constexpr int kLdP = kTcCols + kPad16;   // P^T and dS^T rows (16-bit)
  static constexpr int kLdQ = D + kPadF32;        // per-warp float scratch of dQ (and dK / dV at the end)
  // Layout: K, V, Q, dO (Q and dO adjacent: the dQ scratch reuses them), S^T/dP^T, P^T, dS^T.
  std::size_t k, v, q, dout, s, pt, dst, dq, lse, delta, bytes;
  template <class T>
  __host__ __device__ static BackwardSmem make() {
    BackwardSmem m{};
    SmemCursor c;
    m.k = c.take<T>(kTcRows * kLd);
    m.v = c.take<T>(kTcRows * kLd);
    m.q = c.take<T>(kTcCols * kLd);
    m.dout = c.take<T>(kTcCols * kLd);
    m.s = c.take<float>(kTcWarps * 16 * kLdS);
    m.pt = c.take<T>(kTcRows * kLdP);
    m.dst = c.take<T>(kTcRows * kLdP);
    // The dQ scratch shares Q's and dO's tiles: dQ is computed after the barrier that ends every
    // warp's reads of them, and they are reloaded only after the next tile's barrier.
    static_assert(kTcWarps * 16 * kLdQ * sizeof(float) <= 2 * kTcCols * kLd * sizeof(T),
                  "the dQ scratch must fit in the Q and dO tiles");
    m.dq = m.q;
    m.lse = c.take<float>(kTcCols);
    m.delta = c.take<float>(kTcCols);
    m.bytes = c.offset;
    return m;
  }
};

// A warp's 16 x D accumulator fragments, times `mul`, to rows [first, first + 16) of head hk of a
// [B, S, Hkv, D] tensor, through the warp's float scratch (fragments are inlined by reference, so
// they stay in registers).
template <class T, int D, class Acc>
__device__ __forceinline__ void store_rows(Acc (&frags)[D / 16], float* scratch, T* dst, const KernelSizes& p,
                                           std::int64_t b, std::int64_t hk, std::int64_t first, float mul, int lane) {
  using namespace nvcuda;
  __syncwarp();
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(scratch + n * 16, frags[n], BackwardSmem<D>::kLdQ, wmma::mem_row_major);
  __syncwarp();
  for (int idx = lane; idx < 16 * D; idx += 32) {
    const int row = idx / D, d = idx % D;
    const std::int64_t j = first + row;
    if (j < p.kv_len)
      dst[p.row(b, j, p.kv_len, p.kv_heads, hk) + d] = store_from<T>(scratch[row * BackwardSmem<D>::kLdQ + d] * mul);
  }
}

template <class T, int D, bool kDropout>
__global__ void __launch_bounds__(kTcWarps * 32)
    backward_tc_kernel(const T* __restrict__ grad_out, const T* __restrict__ q, const T* __restrict__ k,
                       const T* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ delta,
                       float* __restrict__ dq_acc, T* __restrict__ grad_k, T* __restrict__ grad_v, KernelSizes p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using namespace nvcuda;
  using Smem = BackwardSmem<D>;
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  extern __shared__ __align__(128) unsigned char smem[];
  const Smem lay = Smem::template make<T>();
  T* sk = reinterpret_cast<T*>(smem + lay.k);
  T* sv = reinterpret_cast<T*>(smem + lay.v);
  T* sq = reinterpret_cast<T*>(smem + lay.q);
  T* sdo = reinterpret_cast<T*>(smem + lay.dout);
  T* spt = reinterpret_cast<T*>(smem + lay.pt);
  T* sdst = reinterpret_cast<T*>(smem + lay.dst);
  float* slse = reinterpret_cast<float*>(smem + lay.lse);
  float* sdelta = reinterpret_cast<float*>(smem + lay.delta);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float* ss = reinterpret_cast<float*>(smem + lay.s) + warp * 16 * Smem::kLdS;
  float* sdq = reinterpret_cast<float*>(smem + lay.dq) + warp * 16 * Smem::kLdQ;

  const std::int64_t k0 = static_cast<std::int64_t>(blockIdx.x) * kTcRows;
  const std::int64_t bhk = blockIdx.y, b = bhk / p.kv_heads, hk = bhk % p.kv_heads;
  load_tile<T, D>(sk, Smem::kLd, k, p, b, k0, p.kv_len, p.kv_heads, hk);
  load_tile<T, D>(sv, Smem::kLd, v, p, b, k0, p.kv_len, p.kv_heads, hk);

  Acc dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.f);
    wmma::fill_fragment(dv[n], 0.f);
  }
  // Lane pair (2r, 2r+1) owns key row r of the warp's 16; half 0 the first 32 query columns.
  const int r = lane / 2, half = lane % 2;
  const std::int64_t j = k0 + warp * 16 + r;
  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  // The first query that sees any key of this block, rounded down to a tile.
  const std::int64_t first = p.causal ? max(k0 - (p.kv_len - p.q_len), std::int64_t{0}) : 0;
  const std::int64_t start = first / kTcCols * kTcCols;
  std::uint64_t drop_base = 0;
  if constexpr (kDropout) drop_base = p.dropout_base();

  // The walk: every query tile from `start` of every query head of the group, as one sequence so
  // that the next step's Q, dO, logsumexp and D are read while this step computes.
  const std::int64_t tiles = (p.q_len - start + kTcCols - 1) / kTcCols, steps = tiles * p.group;
  TileRegs<T, D> next_q, next_do;
  float next_lse = 0.f, next_delta = 0.f;  // threads 0..63: one query row each
  auto prefetch = [&](std::int64_t step) {
    const std::int64_t h = hk * p.group + step / tiles, q0 = start + (step % tiles) * kTcCols;
    next_q.load(q, p, b, q0, p.q_len, p.q_heads, h);
    next_do.load(grad_out, p, b, q0, p.q_len, p.q_heads, h);
    const int c = static_cast<int>(threadIdx.x);
    if (c < kTcCols) {
      const bool in = q0 + c < p.q_len;
      next_lse = in ? lse[(b * p.q_heads + h) * p.q_len + q0 + c] * kLog2e : 0.f;
      next_delta = in ? delta[(b * p.q_heads + h) * p.q_len + q0 + c] : 0.f;
    }
  };
  // At head dim 128 the staging registers would spill (the dK and dV fragments take 128 of them):
  // there the tiles are read at the top of each step instead.
  constexpr bool kPrefetch = D <= 64;
  if constexpr (kPrefetch)
    if (steps > 0) prefetch(0);
  for (std::int64_t step = 0; step < steps; ++step) {
    const std::int64_t h = hk * p.group + step / tiles, q0 = start + (step % tiles) * kTcCols;
    __syncthreads();  // the previous step's Q, dO (and the dQ scratch over them), dS^T are no longer read
    if constexpr (!kPrefetch) prefetch(step);
    next_q.store(sq, Smem::kLd);
    next_do.store(sdo, Smem::kLd);
    if (const int c = static_cast<int>(threadIdx.x); c < kTcCols) {
      slse[c] = next_lse;
      sdelta[c] = next_delta;
    }
    __syncthreads();
    if constexpr (kPrefetch)
      if (step + 1 < steps) prefetch(step + 1);

    // S^T_w = K_w Q^T (16 keys x 64 queries).
    for (int n = 0; n < kTcCols / 16; ++n) {
      Acc acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bt;
        wmma::load_matrix_sync(a, sk + warp * 16 * Smem::kLd + kk * 16, Smem::kLd);
        wmma::load_matrix_sync(bt, sq + n * 16 * Smem::kLd + kk * 16, Smem::kLd);
        wmma::mma_sync(acc, a, bt, acc);
      }
      wmma::store_matrix_sync(ss + n * 16, acc, Smem::kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    float pr[32];
    std::uint32_t kept = 0xffffffffu;  // dropout: bit c set when column c's probability is kept
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = half * 32 + c;
      const std::int64_t i = q0 + col;
      const bool visible = j < p.kv_len && i < p.q_len && j <= p.last_key(i);
      pr[c] = visible ? exp2f(ss[r * Smem::kLdS + col] * scale_log2 - slse[col]) : 0.f;
      float pv = pr[c];  // dV's probability: the dropped one
      if constexpr (kDropout) {
        if (!visible || !p.keep(drop_base, b, h, i, j)) kept &= ~(1u << c);
        pv = (kept >> c) & 1u ? pv * static_cast<float>(p.dropout_scale) : 0.f;
      }
      spt[(warp * 16 + r) * Smem::kLdP + col] = store_from<T>(pv);
    }
    __syncwarp();

    // dP^T_w = V_w dO^T (16 x 64), into the same scratch.
    for (int n = 0; n < kTcCols / 16; ++n) {
      Acc acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bt;
        wmma::load_matrix_sync(a, sv + warp * 16 * Smem::kLd + kk * 16, Smem::kLd);
        wmma::load_matrix_sync(bt, sdo + n * 16 * Smem::kLd + kk * 16, Smem::kLd);
        wmma::mma_sync(acc, a, bt, acc);
      }
      wmma::store_matrix_sync(ss + n * 16, acc, Smem::kLdS, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = half * 32 + c;
      float dp = ss[r * Smem::kLdS + col];
      if constexpr (kDropout) dp = (kept >> c) & 1u ? dp * static_cast<float>(p.dropout_scale) : 0.f;
      const float ds = pr[c] * (dp - sdelta[col]);
      sdst[(warp * 16 + r) * Smem::kLdP + col] = store_from<T>(ds);
    }
    __syncwarp();

    // dV_w += P^T_w dO and dK_w += dS^T_w Q (16 x D each).
#pragma unroll
    for (int kk = 0; kk < kTcCols / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> ap, as;
      wmma::load_matrix_sync(ap, spt + warp * 16 * Smem::kLdP + kk * 16, Smem::kLdP);
      wmma::load_matrix_sync(as, sdst + warp * 16 * Smem::kLdP + kk * 16, Smem::kLdP);
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bd, bq;
        wmma::load_matrix_sync(bd, sdo + kk * 16 * Smem::kLd + n * 16, Smem::kLd);
        wmma::load_matrix_sync(bq, sq + kk * 16 * Smem::kLd + n * 16, Smem::kLd);
        wmma::mma_sync(dv[n], ap, bd, dv[n]);
        wmma::mma_sync(dk[n], as, bq, dk[n]);
      }
    }
    __syncthreads();  // every warp's dS^T rows are in place

    // dQ (rows 16w.. of the tile) += dS K over this block's 64 keys; dS = (dS^T)^T is read
    // column-major straight from dS^T.
    for (int n = 0; n < D / 16; ++n) {
      Acc acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < kTcRows / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bk;
        wmma::load_matrix_sync(a, sdst + kk * 16 * Smem::kLdP + warp * 16, Smem::kLdP);
        wmma::load_matrix_sync(bk, sk + kk * 16 * Smem::kLd + n * 16, Smem::kLd);
        wmma::mma_sync(acc, a, bk, acc);
      }
      wmma::store_matrix_sync(sdq + n * 16, acc, Smem::kLdQ, wmma::mem_row_major);
    }
    __syncwarp();
    for (int idx = lane; idx < 16 * D; idx += 32) {
      const int row = idx / D, d = idx % D;
      const std::int64_t i = q0 + warp * 16 + row;
      if (i < p.q_len) atomicAdd(dq_acc + p.row(b, i, p.q_len, p.q_heads, h) + d, sdq[row * Smem::kLdQ + d]);
    }
  }

  // dK = scale dS^T Q and dV, through the warp's float scratch, to the 16-bit outputs.
  store_rows<T, D>(dk, sdq, grad_k, p, b, hk, k0 + warp * 16, static_cast<float>(p.scale), lane);
  store_rows<T, D>(dv, sdq, grad_v, p, b, hk, k0 + warp * 16, 1.f, lane);
#else
  __trap();  // built only for sm_80+: the dispatcher does not launch it on older devices
#endif
}

template <class T>
__global__ void scale_cast_kernel(const float* __restrict__ src, T* __restrict__ dst, std::int64_t n, float scale) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dst[i] = store_from<T>(src[i] * scale);
}

template <class T, int D, bool kDropout>
void launch_backward_tc_as(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                           const Tensor& delta, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                           const KernelSizes& p, cudaStream_t stream) {
  const std::size_t bytes = BackwardSmem<D>::template make<T>().bytes;
  static std::atomic<std::uint64_t> configured{0};  // this instantiation's devices
  allow_dynamic_smem(backward_tc_kernel<T, D, kDropout>, bytes, q.device().index, configured);
  Tensor dq_acc = Tensor::empty(q.shape(), DType::F32, q.device());
  KILN_CUDA_CHECK(cudaMemsetAsync(dq_acc.data_ptr(), 0, dq_acc.nbytes(), stream));
  const dim3 grid(static_cast<unsigned>((p.kv_len + kTcRows - 1) / kTcRows),
                  static_cast<unsigned>(p.batch * p.kv_heads));
  backward_tc_kernel<T, D, kDropout><<<grid, kTcWarps * 32, bytes, stream>>>(
      static_cast<const T*>(grad_out.data_ptr()), static_cast<const T*>(q.data_ptr()),
      static_cast<const T*>(k.data_ptr()), static_cast<const T*>(v.data_ptr()),
      static_cast<const float*>(lse.data_ptr()), static_cast<const float*>(delta.data_ptr()),
      static_cast<float*>(dq_acc.data_ptr()), static_cast<T*>(grad_k.data_ptr()), static_cast<T*>(grad_v.data_ptr()),
      p);
  KILN_CUDA_CHECK_LAUNCH();
  const std::int64_t n = grad_q.numel();
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 65535));
  scale_cast_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<const float*>(dq_acc.data_ptr()),
                                                   static_cast<T*>(grad_q.data_ptr()), n, static_cast<float>(p.scale));
  KILN_CUDA_CHECK_LAUNCH();
}

template <class T, int D>
void launch_backward_tc(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                        const Tensor& delta, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                        const KernelSizes& p, cudaStream_t stream) {
  if (p.dropout)
    launch_backward_tc_as<T, D, true>(grad_out, q, k, v, lse, delta, grad_q, grad_k, grad_v, p, stream);
  else
    launch_backward_tc_as<T, D, false>(grad_out, q, k, v, lse, delta, grad_q, grad_k, grad_v, p, stream);
}

}  // namespace

void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                        const AttentionParams& params) {
  if (params.impl == AttentionImpl::Cudnn) {
    cudnn_attention_backward(grad_out, q, k, v, out, lse, grad_q, grad_k, grad_v, params);
    return;
  }
  KILN_CHECK(!params.strided(), "te::attention: Kiln's CUDA kernels take contiguous q, k and v (strides are cuDNN's)");
  const int index = q.device().index;
  DeviceGuard guard(index);
  const KernelSizes p = KernelSizes::of(params);
  KILN_CHECK(p.batch * p.q_heads <= 65535, "te::attention: batch x heads = {} exceeds the CUDA grid limit 65535",
             p.batch * p.q_heads);
  cudaStream_t stream = cuda_stream(index);
  Tensor delta = Tensor::empty(lse.shape(), lse.dtype(), lse.device());
  const bool tc =
      tensor_core_path(q, params, {&grad_out, &q, &k, &v, &grad_k, &grad_v}) && device_has_bf16_tensor_cores(index);
  dispatch_cuda_type(q.dtype(), "attention_backward", [&]<class T>() {
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const std::int64_t rows = p.batch * p.q_len * p.q_heads;
    delta_kernel<T, A><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(
        static_cast<const T*>(grad_out.data_ptr()), static_cast<const T*>(out.data_ptr()),
        static_cast<A*>(delta.data_ptr()), p);
    KILN_CUDA_CHECK_LAUNCH();
    if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>) {
      if (tc) {
        if (p.head_dim == 64)
          launch_backward_tc<T, 64>(grad_out, q, k, v, lse, delta, grad_q, grad_k, grad_v, p, stream);
        else
          launch_backward_tc<T, 128>(grad_out, q, k, v, lse, delta, grad_q, grad_k, grad_v, p, stream);
        return;
      }
    }
    const auto* go = static_cast<const T*>(grad_out.data_ptr());
    const auto* qp = static_cast<const T*>(q.data_ptr());
    const auto* kp = static_cast<const T*>(k.data_ptr());
    const auto* vp = static_cast<const T*>(v.data_ptr());
    const auto* lp = static_cast<const A*>(lse.data_ptr());
    const auto* dp = static_cast<const A*>(delta.data_ptr());
    const dim3 qgrid(static_cast<unsigned>((p.q_len + kSimtWarps - 1) / kSimtWarps),
                     static_cast<unsigned>(p.batch * p.q_heads));
    grad_q_simt_kernel<T, A>
        <<<qgrid, kSimtWarps * 32, 0, stream>>>(go, qp, kp, vp, lp, dp, static_cast<T*>(grad_q.data_ptr()), p);
    KILN_CUDA_CHECK_LAUNCH();
    const dim3 kgrid(static_cast<unsigned>((p.kv_len + kSimtWarps - 1) / kSimtWarps),
                     static_cast<unsigned>(p.batch * p.kv_heads));
    grad_kv_simt_kernel<T, A><<<kgrid, kSimtWarps * 32, 0, stream>>>(
        go, qp, kp, vp, lp, dp, static_cast<T*>(grad_k.data_ptr()), static_cast<T*>(grad_v.data_ptr()), p);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace kiln::te::cuda
