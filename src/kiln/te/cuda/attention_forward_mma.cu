// The forward tensor-core kernel written with mma.sync (PTX m16n8k16, bfloat16 / float16 in, float
// accumulation) instead of WMMA: the fragment layouts are the documented ones (PTX ISA, "Matrix
// Fragments for mma.m16n8k16"), so the score tile, the softmax and the output accumulator all stay
// in registers (WMMA's layout is unspecified: its kernel goes through shared memory for both).
// The default Kiln forward (passed its tests on an H200 at 2x the WMMA kernel); KILN_ATTENTION_MMA=0
// selects the WMMA kernel instead.
//
// Lane l of a warp: g = l / 4 (its row group), t = l % 4. An accumulator of an m16n8 tile holds
// (row g, cols 2t, 2t+1) and (row g+8, cols 2t, 2t+1); an A fragment (16 x 16, row-major) holds
// (g, 2t..2t+1), (g+8, 2t..2t+1), (g, 2t+8..2t+9), (g+8, 2t+8..2t+9) as packed pairs; a B fragment
// (16 x 8, "col") holds (rows 2t..2t+1, col g) and (rows 2t+8..2t+9, col g). Two adjacent n8
// accumulator tiles of P are therefore an A fragment of P V directly.
// Attention dropout is a template flag (the kernel without it keeps its registers): the row sums take
// every probability, then the dropped ones (KernelSizes::keep) are zeroed before P V, and the output
// takes the 1 / (1 - p) factor.
#include "kiln/te/attention_kernels.h"
#include "kiln/te/cuda/attention_common.cuh"

namespace kiln::te::cuda {

namespace {

template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  T a = store_from<T>(lo), b = store_from<T>(hi);
  std::uint16_t ua, ub;
  memcpy(&ua, &a, 2);
  memcpy(&ub, &b, 2);
  return static_cast<std::uint32_t>(ua) | (static_cast<std::uint32_t>(ub) << 16);
}
template <class T>
__device__ __forceinline__ std::uint32_t pair_at(const T* p) {  // two adjacent 16-bit elements
  return *reinterpret_cast<const std::uint32_t*>(p);
}
template <class T>
__device__ __forceinline__ std::uint32_t gather2(const T* lo, const T* hi) {  // two elements of one column
  std::uint16_t a, b;
  memcpy(&a, lo, 2);
  memcpy(&b, hi, 2);
  return static_cast<std::uint32_t>(a) | (static_cast<std::uint32_t>(b) << 16);
}

// c += a * b for one m16n8k16 tile.
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

template <int D>
struct MmaSmem {
  static constexpr int kLd = D + kPad16;
  std::size_t q, k, v, bytes;
  template <class T>
  __host__ __device__ static MmaSmem make() {
    MmaSmem m{};
    SmemCursor c;
    m.q = c.take<T>(kTcRows * kLd);
    m.k = c.take<T>(kTcCols * kLd);
    m.v = c.take<T>(kTcCols * kLd);
    m.bytes = c.offset;
    return m;
  }
};

template <class T, int D, bool kDropout>
__global__ void __launch_bounds__(kTcWarps * 32)
    forward_mma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
                       float* __restrict__ lse, KernelSizes p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int kLd = MmaSmem<D>::kLd;
  constexpr int kN = kTcCols / 8;  // n8 tiles of the score row block
  extern __shared__ __align__(128) unsigned char smem[];
  const MmaSmem<D> lay = MmaSmem<D>::template make<T>();
  T* sq = reinterpret_cast<T*>(smem + lay.q);
  T* sk = reinterpret_cast<T*>(smem + lay.k);
  T* sv = reinterpret_cast<T*>(smem + lay.v);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;

  const std::int64_t q0 = static_cast<std::int64_t>(gridDim.x - 1 - blockIdx.x) * kTcRows;  // longest first
  const std::int64_t bh = blockIdx.y, b = bh / p.q_heads, h = bh % p.q_heads, hk = h / p.group;
  load_tile<T, D>(sq, kLd, q, p, b, q0, p.q_len, p.q_heads, h);
  __syncthreads();
  // The warp's 16 query rows as A fragments, one per 16 columns of D, kept for the whole walk.
  std::uint32_t qa[D / 16][4];
  const T* qrow = sq + (warp * 16 + g) * kLd + 2 * t;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    qa[kk][0] = pair_at(qrow + kk * 16);
    qa[kk][1] = pair_at(qrow + 8 * kLd + kk * 16);
    qa[kk][2] = pair_at(qrow + kk * 16 + 8);
    qa[kk][3] = pair_at(qrow + 8 * kLd + kk * 16 + 8);
  }

  const std::int64_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const std::int64_t last[2] = {p.last_key(row[0]), p.last_key(row[1])};
  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  const std::int64_t block_last = p.last_key(min(q0 + kTcRows, p.q_len) - 1);
  const std::int64_t kend = min(max(block_last + 1, std::int64_t{0}), p.kv_len);
  std::uint64_t drop_base = 0;
  if constexpr (kDropout) drop_base = p.dropout_base();

  TileRegs<T, D> next_k, next_v;
  if (kend > 0) {
    next_k.load(k, p, b, 0, p.kv_len, p.kv_heads, hk);
    next_v.load(v, p, b, 0, p.kv_len, p.kv_heads, hk);
  }
  for (std::int64_t k0 = 0; k0 < kend; k0 += kTcCols) {
    __syncthreads();
    next_k.store(sk, kLd);
    next_v.store(sv, kLd);
    __syncthreads();
    if (k0 + kTcCols < kend) {
      next_k.load(k, p, b, k0 + kTcCols, p.kv_len, p.kv_heads, hk);
      next_v.load(v, p, b, k0 + kTcCols, p.kv_len, p.kv_heads, hk);
    }
    // S = Q_w K^T: n8 tile n covers keys n*8 .. n*8+7; B(d, key) = K[key][d], a pair along d.
    float s[kN][4];
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      const T* krow = sk + (n * 8 + g) * kLd + 2 * t;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        mma16816<T>(s[n], qa[kk], pair_at(krow + kk * 16), pair_at(krow + kk * 16 + 8));
    }
    // Online softmax for rows g (elements 0, 1) and g+8 (elements 2, 3), log2 domain; a row's 64
    // columns are spread over the 4 lanes of its group.
    float alpha[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kN; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const std::int64_t j = k0 + n * 8 + 2 * t + e;
          float& x = s[n][2 * hr + e];
          x = (j <= last[hr] && j < p.kv_len) ? x * scale_log2 : -INFINITY;
          tile_max = fmaxf(tile_max, x);
        }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_new = fmaxf(m[hr], tile_max);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      alpha[hr] = exp2f(m[hr] - m_use);
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kN; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[n][2 * hr + e];
          x = exp2f(x - m_use);
          sum += x;
        }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l[hr] = l[hr] * alpha[hr] + sum;
      m[hr] = m_new;
      if constexpr (kDropout) {  // after the sum: the normaliser counts every probability
#pragma unroll
        for (int n = 0; n < kN; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[n][2 * hr + e];
            if (x != 0.f && !p.keep(drop_base, b, h, row[hr], k0 + n * 8 + 2 * t + e)) x = 0.f;
          }
      }
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    // O += P V: keys 16 kk2 .. 16 kk2 + 15 are the n8 tiles 2 kk2 and 2 kk2 + 1 of P; B(key, d) =
    // V[key][d], a pair along the key (two rows of V).
#pragma unroll
    for (int kk2 = 0; kk2 < kTcCols / 16; ++kk2) {
      const std::uint32_t pa[4] = {pack2<T>(s[2 * kk2][0], s[2 * kk2][1]), pack2<T>(s[2 * kk2][2], s[2 * kk2][3]),
                                   pack2<T>(s[2 * kk2 + 1][0], s[2 * kk2 + 1][1]),
                                   pack2<T>(s[2 * kk2 + 1][2], s[2 * kk2 + 1][3])};
      const T* vcol = sv + (kk2 * 16 + 2 * t) * kLd + g;
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        mma16816<T>(o[n], pa, gather2(vcol + n * 8, vcol + kLd + n * 8),
                    gather2(vcol + 8 * kLd + n * 8, vcol + 9 * kLd + n * 8));
    }
  }

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    if (row[hr] >= p.q_len) continue;
    // A row that sees no key: zero output. dropout_scale is 1 without dropout.
    const float inv = l[hr] > 0.f ? static_cast<float>(p.dropout_scale) / l[hr] : 0.f;
    T* orow = out + p.row(b, row[hr], p.q_len, p.q_heads, h) + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<std::uint32_t*>(orow + n * 8) = pack2<T>(o[n][2 * hr] * inv, o[n][2 * hr + 1] * inv);
    if (t == 0) lse[bh * p.q_len + row[hr]] = l[hr] > 0.f ? (m[hr] + log2f(l[hr])) / kLog2e : -INFINITY;
  }
#else
  __trap();  // built only for sm_80+: the dispatcher does not launch it on older devices
#endif
}

template <class T, int D, bool kDropout>
void launch_as(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
               const KernelSizes& p, cudaStream_t stream) {
  const std::size_t bytes = MmaSmem<D>::template make<T>().bytes;
  static std::atomic<std::uint64_t> configured{0};  // this instantiation's devices
  allow_dynamic_smem(forward_mma_kernel<T, D, kDropout>, bytes, q.device().index, configured);
  const dim3 grid(static_cast<unsigned>((p.q_len + kTcRows - 1) / kTcRows), static_cast<unsigned>(p.batch * p.q_heads));
  forward_mma_kernel<T, D, kDropout><<<grid, kTcWarps * 32, bytes, stream>>>(
      static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()), static_cast<const T*>(v.data_ptr()),
      static_cast<T*>(out.data_ptr()), static_cast<float*>(lse.data_ptr()), p);
  KILN_CUDA_CHECK_LAUNCH();
}

template <class T, int D>
void launch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
            const KernelSizes& p, cudaStream_t stream) {
  p.dropout ? launch_as<T, D, true>(q, k, v, out, lse, p, stream)
            : launch_as<T, D, false>(q, k, v, out, lse, p, stream);
}

}  // namespace

void launch_forward_mma(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const KernelSizes& p, cudaStream_t stream) {
  const bool bf16 = q.dtype() == DType::BF16;
  if (p.head_dim == 64)
    bf16 ? launch<__nv_bfloat16, 64>(q, k, v, out, lse, p, stream) : launch<__half, 64>(q, k, v, out, lse, p, stream);
  else
    bf16 ? launch<__nv_bfloat16, 128>(q, k, v, out, lse, p, stream) : launch<__half, 128>(q, k, v, out, lse, p, stream);
}

}  // namespace kiln::te::cuda
