// CUDA kernels of attention_forward.
//
// Tensor-core path (bfloat16 / float16, head dim 64 or 128): FlashAttention-2's forward. A block of
// 4 warps owns 64 query rows of one (batch, head); key and value tiles of 64 rows stream through
// shared memory; each warp computes its 16 x 64 score tile with WMMA 16x16x16 fragments (float
// accumulation), applies the online softmax (2 lanes per row, running max and sum in registers,
// exp2 with the scale folded in), and adds P V into its float output tile. Key tiles entirely
// above the causal diagonal are never loaded.
// SIMT path (every other call): one warp per query row, 32 keys at a time (one per lane), the same
// online softmax; float accumulation, double for double. The mma.sync kernel of
// attention_forward_mma.cu replaces the WMMA one by default (2x faster on the H200);
// KILN_ATTENTION_MMA=0 keeps the WMMA kernel. Calls resolved to cuDNN (params.impl) go to
// attention_cudnn.h instead.
// Attention dropout (p.dropout): every kernel sums a row's normaliser over all its probabilities
// but weights V by the kept ones only (KernelSizes::keep, the CPU kernel's Philox mask), and the
// output takes the 1 / (1 - p) factor with the 1 / l one; the lse is the undropped softmax's.
#include <mma.h>

#include "kiln/te/attention_kernels.h"
#include "kiln/te/cuda/attention_common.cuh"
#include "kiln/te/cuda/attention_cudnn.h"

namespace kiln::te::cuda {

namespace {

// ---- SIMT -----------------------------------------------------------------------------------------

template <class T, class A, class L>
__global__ void __launch_bounds__(kSimtWarps * 32)
    forward_simt_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
                        L* __restrict__ lse, KernelSizes p) {
  constexpr int kChunks = kMaxHeadDim / 32;
  __shared__ A q_rows[kSimtWarps][kMaxHeadDim];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kSimtWarps + warp;
  const std::int64_t bh = blockIdx.y, b = bh / p.q_heads, h = bh % p.q_heads, hk = h / p.group;
  if (i >= p.q_len) return;  // whole warps leave: no block-wide barrier follows
  const int D = static_cast<int>(p.head_dim);
  const A scale = static_cast<A>(p.scale);
  const T* qrow = q + p.row(b, i, p.q_len, p.q_heads, h);
  for (int d = lane; d < D; d += 32) q_rows[warp][d] = load_acc<A>(qrow[d]) * scale;
  __syncwarp();
  const std::int64_t kend = min(max(p.last_key(i) + 1, std::int64_t{0}), p.kv_len);
  const std::uint64_t drop_base = p.dropout ? p.dropout_base() : 0;
  A m = neg_inf<A>(), l = 0, o[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) o[c] = 0;
  for (std::int64_t j0 = 0; j0 < kend; j0 += 32) {
    const std::int64_t j = j0 + lane;
    A s = neg_inf<A>();
    if (j < kend) {
      const T* krow = k + p.row(b, j, p.kv_len, p.kv_heads, hk);
      A acc = 0;
      for (int d = 0; d < D; ++d) acc += q_rows[warp][d] * load_acc<A>(krow[d]);
      s = acc;
    }
    const A m_new = max(m, warp_max(s));  // finite: key j0 is visible
    const A alpha = exp_acc(m - m_new);
    const A pj = j < kend ? exp_acc(s - m_new) : A(0);
    l = l * alpha + warp_sum(pj);
    const A pw = p.dropout && j < kend && !p.keep(drop_base, b, h, i, j) ? A(0) : pj;  // V's weight
#pragma unroll
    for (int c = 0; c < kChunks; ++c) o[c] *= alpha;
    const int n = kend - j0 < 32 ? static_cast<int>(kend - j0) : 32;
    for (int jj = 0; jj < n; ++jj) {
      const A w = __shfl_sync(0xffffffffu, pw, jj);
      const T* vrow = v + p.row(b, j0 + jj, p.kv_len, p.kv_heads, hk);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < D) o[c] += w * load_acc<A>(vrow[d]);
      }
    }
    m = m_new;
  }
  const A inv = l > 0 ? static_cast<A>(p.dropout_scale) / l : A(0);  // a row that sees no key: zero output
  T* orow = out + p.row(b, i, p.q_len, p.q_heads, h);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int d = lane + 32 * c;
    if (d < D) orow[d] = store_from<T>(o[c] * inv);
  }
  if (lane == 0) lse[bh * p.q_len + i] = l > 0 ? static_cast<L>(m + log_acc(l)) : neg_inf<L>();
}

// ---- tensor cores -----------------------------------------------------------------------------------

template <int D>
struct ForwardSmem {
  static constexpr int kLd = D + kPad16;          // Q, K, V rows
  static constexpr int kLdS = kTcCols + kPadF32;  // score tile rows (float)
  static constexpr int kLdP = kTcCols + kPad16;   // probability tile rows (16-bit)
  static constexpr int kLdO = D + kPadF32;        // output accumulator rows (float)
  std::size_t q, k, v, s, pr, o, bytes;
  template <class T>
  __host__ __device__ static ForwardSmem make() {
    ForwardSmem m{};
    SmemCursor c;
    m.q = c.take<T>(kTcRows * kLd);
    m.k = c.take<T>(kTcCols * kLd);
    m.v = c.take<T>(kTcCols * kLd);
    m.s = c.take<float>(kTcWarps * 16 * kLdS);
    m.pr = c.take<T>(kTcWarps * 16 * kLdP);
    m.o = c.take<float>(kTcWarps * 16 * kLdO);
    m.bytes = c.offset;
    return m;
  }
};

template <class T, int D>
__global__ void __launch_bounds__(kTcWarps * 32)
    forward_tc_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
                      float* __restrict__ lse, KernelSizes p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using namespace nvcuda;
  using Smem = ForwardSmem<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const Smem lay = Smem::template make<T>();
  T* sq = reinterpret_cast<T*>(smem + lay.q);
  T* sk = reinterpret_cast<T*>(smem + lay.k);
  T* sv = reinterpret_cast<T*>(smem + lay.v);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float* ss = reinterpret_cast<float*>(smem + lay.s) + warp * 16 * Smem::kLdS;
  T* sp = reinterpret_cast<T*>(smem + lay.pr) + warp * 16 * Smem::kLdP;
  float* so = reinterpret_cast<float*>(smem + lay.o) + warp * 16 * Smem::kLdO;

  // The last query tiles first: under a causal mask they have the most key tiles, and starting
  // them early keeps the tail of the grid short.
  const std::int64_t q0 = static_cast<std::int64_t>(gridDim.x - 1 - blockIdx.x) * kTcRows;
  const std::int64_t bh = blockIdx.y, b = bh / p.q_heads, h = bh % p.q_heads, hk = h / p.group;
  load_tile<T, D>(sq, Smem::kLd, q, p, b, q0, p.q_len, p.q_heads, h);
  for (int idx = lane; idx < 16 * Smem::kLdO; idx += 32) so[idx] = 0.f;
  __syncwarp();

  // Lane pair (2r, 2r+1) owns row r of the warp's 16: half 0 the first 32 columns of a tile.
  const int r = lane / 2, half = lane % 2;
  const std::int64_t i = q0 + warp * 16 + r;
  const std::int64_t last = p.last_key(i);
  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  float m = -INFINITY, l = 0.f;
  const std::int64_t block_last = p.last_key(min(q0 + kTcRows, p.q_len) - 1);
  const std::int64_t kend = min(max(block_last + 1, std::int64_t{0}), p.kv_len);
  const std::uint64_t drop_base = p.dropout ? p.dropout_base() : 0;

  TileRegs<T, D> next_k, next_v;  // the next key/value tile, read while this one is used
  if (kend > 0) {
    next_k.load(k, p, b, 0, p.kv_len, p.kv_heads, hk);
    next_v.load(v, p, b, 0, p.kv_len, p.kv_heads, hk);
  }
  for (std::int64_t k0 = 0; k0 < kend; k0 += kTcCols) {
    __syncthreads();  // the previous tile's K and V are no longer read
    next_k.store(sk, Smem::kLd);
    next_v.store(sv, Smem::kLd);
    __syncthreads();
    if (k0 + kTcCols < kend) {
      next_k.load(k, p, b, k0 + kTcCols, p.kv_len, p.kv_heads, hk);
      next_v.load(v, p, b, k0 + kTcCols, p.kv_len, p.kv_heads, hk);
    }

    // S = Q_w K^T (16 x 64), float.
    for (int n = 0; n < kTcCols / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bt;
        wmma::load_matrix_sync(a, sq + warp * 16 * Smem::kLd + kk * 16, Smem::kLd);
        wmma::load_matrix_sync(bt, sk + n * 16 * Smem::kLd + kk * 16, Smem::kLd);
        wmma::mma_sync(acc, a, bt, acc);
      }
      wmma::store_matrix_sync(ss + n * 16, acc, Smem::kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax on the lane's 32 columns of row r, in the log2 domain.
    float x[32];
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const std::int64_t j = k0 + half * 32 + c;
      const bool visible = j <= last && j < p.kv_len;
      x[c] = visible ? ss[r * Smem::kLdS + half * 32 + c] * scale_log2 : -INFINITY;
      tile_max = fmaxf(tile_max, x[c]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: keep everything 0
    const float alpha = exp2f(m - m_use);
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const float pc = exp2f(x[c] - m_use);
      sum += pc;  // the normaliser sums every probability, dropped or not
      const bool dropped = p.dropout && pc != 0.f && !p.keep(drop_base, b, h, i, k0 + half * 32 + c);
      sp[r * Smem::kLdP + half * 32 + c] = store_from<T>(dropped ? 0.f : pc);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) so[r * Smem::kLdO + d] *= alpha;
    __syncwarp();

    // O_w += P V (16 x D).
    for (int n = 0; n < D / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, so + n * 16, Smem::kLdO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kTcCols / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bv;
        wmma::load_matrix_sync(a, sp + kk * 16, Smem::kLdP);
        wmma::load_matrix_sync(bv, sv + kk * 16 * Smem::kLd + n * 16, Smem::kLd);
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(so + n * 16, acc, Smem::kLdO, wmma::mem_row_major);
    }
    __syncwarp();
  }

  if (i < p.q_len) {
    const float inv = l > 0.f ? static_cast<float>(p.dropout_scale) / l : 0.f;  // no key seen: zero output
    T* orow = out + p.row(b, i, p.q_len, p.q_heads, h);
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) orow[d] = store_from<T>(so[r * Smem::kLdO + d] * inv);
    if (half == 0) lse[bh * p.q_len + i] = l > 0.f ? (m + log2f(l)) / kLog2e : -INFINITY;
  }
#else
  __trap();  // built only for sm_80+: the dispatcher does not launch it on older devices
#endif
}

template <class T, int D>
void launch_forward_tc(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                       const KernelSizes& p, cudaStream_t stream) {
  const std::size_t bytes = ForwardSmem<D>::template make<T>().bytes;
  static std::atomic<std::uint64_t> configured{0};  // this instantiation's devices
  allow_dynamic_smem(forward_tc_kernel<T, D>, bytes, q.device().index, configured);
  const dim3 grid(static_cast<unsigned>((p.q_len + kTcRows - 1) / kTcRows), static_cast<unsigned>(p.batch * p.q_heads));
  forward_tc_kernel<T, D><<<grid, kTcWarps * 32, bytes, stream>>>(
      static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()), static_cast<const T*>(v.data_ptr()),
      static_cast<T*>(out.data_ptr()), static_cast<float*>(lse.data_ptr()), p);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                       const AttentionParams& params) {
  if (params.impl == AttentionImpl::Cudnn) {
    cudnn_attention_forward(q, k, v, out, lse, params);
    return;
  }
  KILN_CHECK(!params.strided(), "te::attention: Kiln's CUDA kernels take contiguous q, k and v (strides are cuDNN's)");
  const int index = q.device().index;
  DeviceGuard guard(index);
  const KernelSizes p = KernelSizes::of(params);
  KILN_CHECK(p.batch * p.q_heads <= 65535, "te::attention: batch x heads = {} exceeds the CUDA grid limit 65535",
             p.batch * p.q_heads);
  cudaStream_t stream = cuda_stream(index);
  if (tensor_core_path(q, params, {&q, &k, &v, &out}) && device_has_bf16_tensor_cores(index)) {
    if (mma_forward_selected()) {
      launch_forward_mma(q, k, v, out, lse, p, stream);
      return;
    }
    dispatch_cuda_type(q.dtype(), "attention_forward", [&]<class T>() {
      if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>) {
        if (p.head_dim == 64)
          launch_forward_tc<T, 64>(q, k, v, out, lse, p, stream);
        else
          launch_forward_tc<T, 128>(q, k, v, out, lse, p, stream);
      }
    });
    return;
  }
  dispatch_cuda_type(q.dtype(), "attention_forward", [&]<class T>() {
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const dim3 grid(static_cast<unsigned>((p.q_len + kSimtWarps - 1) / kSimtWarps),
                    static_cast<unsigned>(p.batch * p.q_heads));
    forward_simt_kernel<T, A, A><<<grid, kSimtWarps * 32, 0, stream>>>(
        static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()), static_cast<const T*>(v.data_ptr()),
        static_cast<T*>(out.data_ptr()), static_cast<A*>(lse.data_ptr()), p);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace kiln::te::cuda
