#pragma once
// The router's score + top-k for one token, for the host (te/cpu/moe.cpp, in double) and the
// device (te/cuda/moe.cu, one thread per token, in float). Selection keeps no per-expert storage:
// the experts are ranked by (selection score descending, index ascending), and each of the k
// passes takes the best expert ranked after the previous pick, so the picks are that order's
// prefix. Groups are ranked the same way and kept in a 64-bit mask (num_groups <= 64).
#include <cstdint>

#include "kiln/te/gelu_tanh.h"  // KILN_TE_HD
#include "kiln/te/moe_ops.h"

namespace kiln::te::moe_math {

#if defined(__CUDA_ARCH__)
template <class A>
__device__ __forceinline__ A exp_(A x) {
  return ::exp(x);
}
#else
template <class A>
inline A exp_(A x) {
  return std::exp(x);
}
#endif

template <class A>
KILN_TE_HD A sigmoid_(A x) {
  return A(1) / (A(1) + exp_(-x));
}

// True when (va, a) ranks before (vb, b).
template <class A>
KILN_TE_HD bool ranks_before(A va, std::int64_t a, A vb, std::int64_t b) {
  return va > vb || (va == vb && a < b);
}

// The max and the softmax denominator of a row (pre-softmax scores).
template <class A>
struct RowSoftmax {
  A max = 0, sum = 1;
};

template <class A, class L>
KILN_TE_HD RowSoftmax<A> row_softmax(const L* logits, std::int64_t e_count) {
  RowSoftmax<A> s;
  s.max = static_cast<A>(logits[0]);
  for (std::int64_t e = 1; e < e_count; ++e)
    s.max = static_cast<A>(logits[e]) > s.max ? static_cast<A>(logits[e]) : s.max;
  s.sum = 0;
  for (std::int64_t e = 0; e < e_count; ++e) s.sum += exp_(static_cast<A>(logits[e]) - s.max);
  return s;
}

// The score experts are chosen by.
template <class A, class L>
KILN_TE_HD A selection_score(const L* logits, const L* bias, std::int64_t e, const RouterTopkParams& p,
                             const RowSoftmax<A>& sm) {
  const A l = static_cast<A>(logits[e]);
  if (p.score == RouterScore::Sigmoid) return sigmoid_(l) + (bias ? static_cast<A>(bias[e]) : A(0));
  if (p.pre_softmax) return exp_(l - sm.max) / sm.sum;
  return l;
}

// Writes the k picks to idx[0 .. k) and their probabilities to probs[0 .. k).
template <class A, class L>
KILN_TE_HD void router_topk_row(const L* logits, const L* bias, std::int64_t e_count, const RouterTopkParams& p,
                                L* probs, std::int64_t* idx) {
  const RowSoftmax<A> sm =
      p.score == RouterScore::Softmax && p.pre_softmax ? row_softmax<A, L>(logits, e_count) : RowSoftmax<A>{};
  // Group limit: a mask of the kept groups.
  std::uint64_t kept_groups = ~std::uint64_t{0};
  std::int64_t per_group = e_count;
  if (p.num_groups > 0) {
    per_group = e_count / p.num_groups;
    const std::int64_t m = p.topk / p.group_topk;  // Megatron: the sum of each group's top (k / group_topk)
    kept_groups = 0;
    A prev_g = 0;
    std::int64_t prev_gi = -1;
    for (std::int64_t t = 0; t < p.group_topk; ++t) {
      A best_g = 0;
      std::int64_t best_gi = -1;
      for (std::int64_t g = 0; g < p.num_groups; ++g) {
        // The group's score: its top m selection scores, summed.
        A gs = 0, prev = 0;
        std::int64_t prev_i = -1;
        for (std::int64_t s = 0; s < m; ++s) {
          A best = 0;
          std::int64_t best_i = -1;
          for (std::int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
            const A v = selection_score<A, L>(logits, bias, e, p, sm);
            if (prev_i >= 0 && !ranks_before(prev, prev_i, v, e)) continue;
            if (best_i < 0 || ranks_before(v, e, best, best_i)) best = v, best_i = e;
          }
          gs += best;
          prev = best, prev_i = best_i;
        }
        if (prev_gi >= 0 && !ranks_before(prev_g, prev_gi, gs, g)) continue;
        if (best_gi < 0 || ranks_before(gs, g, best_g, best_gi)) best_g = gs, best_gi = g;
      }
      kept_groups |= std::uint64_t{1} << best_gi;
      prev_g = best_g, prev_gi = best_gi;
    }
  }
  A prev = 0;
  std::int64_t prev_i = -1;
  for (std::int64_t t = 0; t < p.topk; ++t) {
    A best = 0;
    std::int64_t best_i = -1;
    for (std::int64_t e = 0; e < e_count; ++e) {
      if (!((kept_groups >> (e / per_group)) & 1u)) continue;
      const A v = selection_score<A, L>(logits, bias, e, p, sm);
      if (prev_i >= 0 && !ranks_before(prev, prev_i, v, e)) continue;
      if (best_i < 0 || ranks_before(v, e, best, best_i)) best = v, best_i = e;
    }
    idx[t] = best_i;
    prev = best, prev_i = best_i;
  }
  // The probabilities of the picks.
  A total = 0;
  if (p.score == RouterScore::Softmax && !p.pre_softmax) {
    const A m = static_cast<A>(logits[idx[0]]);  // the largest selected logit
    for (std::int64_t t = 0; t < p.topk; ++t) total += exp_(static_cast<A>(logits[idx[t]]) - m);
    for (std::int64_t t = 0; t < p.topk; ++t)
      probs[t] = static_cast<L>(exp_(static_cast<A>(logits[idx[t]]) - m) / total);
  } else if (p.score == RouterScore::Softmax) {
    for (std::int64_t t = 0; t < p.topk; ++t)
      probs[t] = static_cast<L>(exp_(static_cast<A>(logits[idx[t]]) - sm.max) / sm.sum);
  } else {
    for (std::int64_t t = 0; t < p.topk; ++t) total += sigmoid_(static_cast<A>(logits[idx[t]]));
    const A denom = p.topk > 1 ? total + A(1e-20) : A(1);
    for (std::int64_t t = 0; t < p.topk; ++t)
      probs[t] = static_cast<L>(sigmoid_(static_cast<A>(logits[idx[t]])) / denom);
  }
  if (p.scaling_factor != 0)
    for (std::int64_t t = 0; t < p.topk; ++t)
      probs[t] = static_cast<L>(static_cast<A>(probs[t]) * static_cast<A>(p.scaling_factor));
}

// dlogits[0 .. E) of one token (every entry written) from dprobs[0 .. k).
template <class A, class L>
KILN_TE_HD void router_topk_backward_row(const L* dprobs, const L* logits, const std::int64_t* idx, const L* probs,
                                         std::int64_t e_count, const RouterTopkParams& p, L* dlogits) {
  const A s = p.scaling_factor != 0 ? static_cast<A>(p.scaling_factor) : A(1);
  for (std::int64_t e = 0; e < e_count; ++e) dlogits[e] = 0;
  if (p.score == RouterScore::Softmax && !p.pre_softmax) {
    // q = softmax of the selected logits = probs / s; dl_j = q_j (g_j - sum_i q_i g_i), g = s dprobs.
    A dot = 0;
    for (std::int64_t t = 0; t < p.topk; ++t) dot += static_cast<A>(probs[t]) / s * static_cast<A>(dprobs[t]) * s;
    for (std::int64_t t = 0; t < p.topk; ++t)
      dlogits[idx[t]] = static_cast<L>(static_cast<A>(probs[t]) / s * (static_cast<A>(dprobs[t]) * s - dot));
  } else if (p.score == RouterScore::Softmax) {
    // P = softmax(logits); dP at the picks = s dprobs; dl_e = P_e (dP_e - sum_j P_j dP_j).
    const RowSoftmax<A> sm = row_softmax<A, L>(logits, e_count);
    A dot = 0;
    for (std::int64_t t = 0; t < p.topk; ++t)
      dot += exp_(static_cast<A>(logits[idx[t]]) - sm.max) / sm.sum * static_cast<A>(dprobs[t]) * s;
    for (std::int64_t e = 0; e < e_count; ++e)
      dlogits[e] = static_cast<L>(-exp_(static_cast<A>(logits[e]) - sm.max) / sm.sum * dot);
    for (std::int64_t t = 0; t < p.topk; ++t) {
      const A pe = exp_(static_cast<A>(logits[idx[t]]) - sm.max) / sm.sum;
      dlogits[idx[t]] = static_cast<L>(static_cast<A>(dlogits[idx[t]]) + pe * static_cast<A>(dprobs[t]) * s);
    }
  } else {
    // probs_j = s sg_j / S with S = sum sg + 1e-20 (k > 1); dsg_j = s (dprobs_j / S - sum_i dprobs_i sg_i / S^2).
    A total = 0, dot = 0;
    for (std::int64_t t = 0; t < p.topk; ++t) {
      const A sg = sigmoid_(static_cast<A>(logits[idx[t]]));
      total += sg;
      dot += static_cast<A>(dprobs[t]) * sg;
    }
    const A denom = total + A(1e-20);
    for (std::int64_t t = 0; t < p.topk; ++t) {
      const A sg = sigmoid_(static_cast<A>(logits[idx[t]]));
      const A dsg =
          p.topk > 1 ? s * (static_cast<A>(dprobs[t]) / denom - dot / (denom * denom)) : s * static_cast<A>(dprobs[t]);
      dlogits[idx[t]] = static_cast<L>(dsg * sg * (A(1) - sg));
    }
  }
}

}  // namespace kiln::te::moe_math
