// CPU kernels of attention_forward / attention_backward: FlashAttention-2's algorithm on the host.
// The forward walks a block of query rows over tiles of keys with the online softmax (running max
// and sum per row, the output rescaled when the max grows), so memory is a few tiles per thread,
// never a [T, S] score matrix. The backward recomputes each tile's probabilities from the saved
// logsumexp. Work is split over (batch, head) pairs; the backward splits over (batch, key/value
// head) so that the gradients of a group's key/value head, summed over its query heads, have one
// writer. Accumulation in float for float32 / bfloat16 / float16, in double for float64.
// Attention dropout (p.dropout > 0): the forward weights V by the kept probabilities (scaled by
// 1 / (1 - p)) but sums the row's normaliser over all of them; the backward regenerates the same
// mask (attention_dropout.h), so dV uses the dropped probabilities and dP = dO V^T is masked and
// scaled before dS = P (dP - D). D = rowsum(dO * O) needs no change: sum_j P_ij dP_ij =
// sum_j P_ij (M_ij / (1 - p)) (dO_i . V_j) = dO_i . O_i, O being the dropped output.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/parallel.h"
#include "kiln/te/attention_dropout.h"
#include "kiln/te/attention_kernels.h"

namespace kiln::te::cpu {

namespace {

using ops::cpu::acc_t;
using ops::cpu::from_acc;
using ops::cpu::parallel_for;

constexpr std::int64_t kQueryBlock = 16;  // query rows that share one pass over the key tiles
constexpr std::int64_t kKeyTile = 64;     // keys converted to the accumulation type at a time

// The dropout of one call as the kernels apply it: keep(b, h, i, j) and the kept probabilities'
// factor; with no dropout every probability is kept with factor 1.
struct DropoutMask {
  bool on = false;
  std::uint64_t seed = 0, offset = 0;
  std::uint32_t threshold = 0;
  std::int64_t q_heads = 0, q_len = 0, kv_len = 0;

  explicit DropoutMask(const AttentionParams& p)
      : on(p.has_dropout()),
        seed(p.dropout_seed),
        offset(p.dropout_offset + (p.dropout_offset_device ? static_cast<std::uint64_t>(*p.dropout_offset_device) : 0)),
        threshold(p.dropout_threshold()),
        q_heads(p.q_heads),
        q_len(p.q_len),
        kv_len(p.kv_len) {}
  bool keep(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return !on || attention_dropout_keep(seed, attention_dropout_counter(offset, b, h, i, j, q_heads, q_len, kv_len),
                                         threshold);
  }
};

// Eight independent partial sums: without them the compiler may not reorder the float sum and
// the loop stays scalar; with them it becomes SIMD (a different, equally accurate order).
template <class A>
A dot(const A* a, const A* b, std::int64_t n) {
  A part[8] = {};
  std::int64_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (int u = 0; u < 8; ++u) part[u] += a[d + u] * b[d + u];
  A tail = 0;
  for (; d < n; ++d) tail += a[d] * b[d];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7])) + tail;
}

// Rows [first, first + rows) of a [.., len, heads, D] tensor's head `h` of batch `b`, converted.
template <class T, class A>
void load_rows(const T* base, std::int64_t b, std::int64_t len, std::int64_t heads, std::int64_t h, std::int64_t first,
               std::int64_t rows, std::int64_t dim, A* dst) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* src = base + (((b * len) + first + r) * heads + h) * dim;
    for (std::int64_t d = 0; d < dim; ++d) dst[r * dim + d] = static_cast<A>(static_cast<float>(src[d]));
  }
}
template <class A>
void load_rows(const double* base, std::int64_t b, std::int64_t len, std::int64_t heads, std::int64_t h,
               std::int64_t first, std::int64_t rows, std::int64_t dim, A* dst) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const double* src = base + (((b * len) + first + r) * heads + h) * dim;
    for (std::int64_t d = 0; d < dim; ++d) dst[r * dim + d] = static_cast<A>(src[d]);
  }
}

// One past the last key any row of the query block [first, first + rows) sees.
std::int64_t key_end(const AttentionParams& p, std::int64_t first, std::int64_t rows) {
  return std::clamp<std::int64_t>(p.last_key(first + rows - 1) + 1, 0, p.kv_len);
}
// How many keys of the tile starting at `tile` query row i sees (the tile has `cols` keys).
std::int64_t row_cols(const AttentionParams& p, std::int64_t i, std::int64_t tile, std::int64_t cols) {
  return std::clamp<std::int64_t>(p.last_key(i) - tile + 1, 0, cols);
}

template <class T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const AttentionParams& p) {
  using A = acc_t<T>;
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const T* qp = static_cast<const T*>(q.data_ptr());
  const T* kp = static_cast<const T*>(k.data_ptr());
  const T* vp = static_cast<const T*>(v.data_ptr());
  T* op = static_cast<T*>(out.data_ptr());
  L* lp = static_cast<L*>(lse.data_ptr());
  const std::int64_t D = p.head_dim, T_ = p.q_len, S = p.kv_len, G = p.group();
  const A scale = static_cast<A>(p.scale);
  const DropoutMask mask(p);
  const A drop_scale = mask.on ? static_cast<A>(p.dropout_scale()) : A(1);
  parallel_for(p.batch * p.q_heads, 1, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<A> qa(kQueryBlock * D), ka(kKeyTile * D), va(kKeyTile * D), o(kQueryBlock * D), s(kKeyTile);
    A m[kQueryBlock], l[kQueryBlock];
    for (std::int64_t task = lo; task < hi; ++task) {
      const std::int64_t b = task / p.q_heads, h = task % p.q_heads, hk = h / G;
      for (std::int64_t q0 = 0; q0 < T_; q0 += kQueryBlock) {
        const std::int64_t rows = std::min(kQueryBlock, T_ - q0);
        load_rows(qp, b, T_, p.q_heads, h, q0, rows, D, qa.data());
        for (A& x : qa) x *= scale;
        std::fill(o.begin(), o.end(), A(0));
        std::fill(m, m + kQueryBlock, -std::numeric_limits<A>::infinity());
        std::fill(l, l + kQueryBlock, A(0));
        const std::int64_t kend = key_end(p, q0, rows);
        for (std::int64_t k0 = 0; k0 < kend; k0 += kKeyTile) {
          const std::int64_t cols = std::min(kKeyTile, kend - k0);
          load_rows(kp, b, S, p.kv_heads, hk, k0, cols, D, ka.data());
          load_rows(vp, b, S, p.kv_heads, hk, k0, cols, D, va.data());
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::int64_t n = row_cols(p, q0 + r, k0, cols);
            if (n == 0) continue;
            A tile_max = -std::numeric_limits<A>::infinity();
            for (std::int64_t c = 0; c < n; ++c) {
              s[c] = dot(&qa[r * D], &ka[c * D], D);
              tile_max = std::max(tile_max, s[c]);
            }
            const A m_new = std::max(m[r], tile_max);
            const A alpha = std::exp(m[r] - m_new);  // 0 on the row's first tile (m = -inf)
            A* orow = &o[r * D];
            for (std::int64_t d = 0; d < D; ++d) orow[d] *= alpha;
            A sum = 0;
            for (std::int64_t c = 0; c < n; ++c) {
              const A pc = std::exp(s[c] - m_new);
              sum += pc;  // the normaliser sums every probability, dropped or not
              if (!mask.keep(b, h, q0 + r, k0 + c)) continue;
              const A* vrow = &va[c * D];
              for (std::int64_t d = 0; d < D; ++d) orow[d] += pc * vrow[d];
            }
            l[r] = l[r] * alpha + sum;
            m[r] = m_new;
          }
        }
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t i = q0 + r;
          T* dst = op + ((b * T_ + i) * p.q_heads + h) * D;
          const A inv = l[r] > 0 ? drop_scale / l[r] : A(0);  // a row that sees no key: zero output
          for (std::int64_t d = 0; d < D; ++d) dst[d] = from_acc<T>(o[r * D + d] * inv);
          lp[(b * p.q_heads + h) * T_ + i] =
              l[r] > 0 ? static_cast<L>(m[r] + std::log(l[r])) : -std::numeric_limits<L>::infinity();
        }
      }
    }
  });
}

template <class T>
void backward_typed(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                    const AttentionParams& p) {
  using A = acc_t<T>;
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const T* gop = static_cast<const T*>(grad_out.data_ptr());
  const T* qp = static_cast<const T*>(q.data_ptr());
  const T* kp = static_cast<const T*>(k.data_ptr());
  const T* vp = static_cast<const T*>(v.data_ptr());
  const T* op = static_cast<const T*>(out.data_ptr());
  const L* lp = static_cast<const L*>(lse.data_ptr());
  T* gq = static_cast<T*>(grad_q.data_ptr());
  T* gk = static_cast<T*>(grad_k.data_ptr());
  T* gv = static_cast<T*>(grad_v.data_ptr());
  const std::int64_t D = p.head_dim, T_ = p.q_len, S = p.kv_len, G = p.group();
  const A scale = static_cast<A>(p.scale);
  const DropoutMask mask(p);
  const A drop_scale = mask.on ? static_cast<A>(p.dropout_scale()) : A(1);
  parallel_for(p.batch * p.kv_heads, 1, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<A> qa(kQueryBlock * D), doa(kQueryBlock * D), oa(kQueryBlock * D), dq(kQueryBlock * D),
        ka(kKeyTile * D), va(kKeyTile * D), dk(S * D), dv(S * D);
    A delta[kQueryBlock], row_lse[kQueryBlock];
    for (std::int64_t task = lo; task < hi; ++task) {
      const std::int64_t b = task / p.kv_heads, hk = task % p.kv_heads;
      std::fill(dk.begin(), dk.end(), A(0));
      std::fill(dv.begin(), dv.end(), A(0));
      for (std::int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        for (std::int64_t q0 = 0; q0 < T_; q0 += kQueryBlock) {
          const std::int64_t rows = std::min(kQueryBlock, T_ - q0);
          load_rows(qp, b, T_, p.q_heads, h, q0, rows, D, qa.data());
          load_rows(gop, b, T_, p.q_heads, h, q0, rows, D, doa.data());
          load_rows(op, b, T_, p.q_heads, h, q0, rows, D, oa.data());
          std::fill(dq.begin(), dq.end(), A(0));
          for (std::int64_t r = 0; r < rows; ++r) {
            // D_i = rowsum(dO * O): the softmax backward's correction term.
            delta[r] = dot(&doa[r * D], &oa[r * D], D);
            row_lse[r] = static_cast<A>(lp[(b * p.q_heads + h) * T_ + q0 + r]);
          }
          const std::int64_t kend = key_end(p, q0, rows);
          for (std::int64_t k0 = 0; k0 < kend; k0 += kKeyTile) {
            const std::int64_t cols = std::min(kKeyTile, kend - k0);
            load_rows(kp, b, S, p.kv_heads, hk, k0, cols, D, ka.data());
            load_rows(vp, b, S, p.kv_heads, hk, k0, cols, D, va.data());
            for (std::int64_t r = 0; r < rows; ++r) {
              const std::int64_t n = row_cols(p, q0 + r, k0, cols);
              const A* qrow = &qa[r * D];
              const A* dorow = &doa[r * D];
              A* dqrow = &dq[r * D];
              for (std::int64_t c = 0; c < n; ++c) {
                const A pr = std::exp(scale * dot(qrow, &ka[c * D], D) - row_lse[r]);
                // With dropout: the kept probability's factor (0 when dropped) on dV's P and on dP.
                const A keep = mask.keep(b, h, q0 + r, k0 + c) ? drop_scale : A(0);
                const A dp = keep != 0 ? dot(dorow, &va[c * D], D) * keep : A(0);
                const A ds = pr * (dp - delta[r]);
                const A pv = pr * keep;
                A* dvrow = &dv[(k0 + c) * D];
                A* dkrow = &dk[(k0 + c) * D];
                const A* krow = &ka[c * D];
                for (std::int64_t d = 0; d < D; ++d) {
                  dvrow[d] += pv * dorow[d];
                  dkrow[d] += ds * qrow[d];
                  dqrow[d] += ds * krow[d];
                }
              }
            }
          }
          for (std::int64_t r = 0; r < rows; ++r) {
            T* dst = gq + ((b * T_ + q0 + r) * p.q_heads + h) * D;
            for (std::int64_t d = 0; d < D; ++d) dst[d] = from_acc<T>(dq[r * D + d] * scale);
          }
        }
      }
      for (std::int64_t j = 0; j < S; ++j) {
        T* dkdst = gk + ((b * S + j) * p.kv_heads + hk) * D;
        T* dvdst = gv + ((b * S + j) * p.kv_heads + hk) * D;
        for (std::int64_t d = 0; d < D; ++d) {
          dkdst[d] = from_acc<T>(dk[j * D + d] * scale);
          dvdst[d] = from_acc<T>(dv[j * D + d]);
        }
      }
    }
  });
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                       const AttentionParams& p) {
  KILN_CHECK(!p.strided(), "te::attention: the CPU kernels take contiguous q, k and v (strides are cuDNN's)");
  KILN_DISPATCH_FLOATING(q.dtype(), "attention_forward", [&]<class T>() { forward_typed<T>(q, k, v, out, lse, p); });
}

void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                        const AttentionParams& p) {
  KILN_CHECK(!p.strided(), "te::attention: the CPU kernels take contiguous q, k and v (strides are cuDNN's)");
  KILN_DISPATCH_FLOATING(q.dtype(), "attention_backward",
                         [&]<class T>() { backward_typed<T>(grad_out, q, k, v, out, lse, grad_q, grad_k, grad_v, p); });
}

}  // namespace kiln::te::cpu
