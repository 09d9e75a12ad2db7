// Cases of te/'s attention family (te/attention.h): attention_forward and attention_backward,
// causal and not, grouped-query heads, fewer queries than keys (the KV-cache alignment), head dims
// that take the CUDA tensor-core kernels (64, 128 at bfloat16) and one that does not, and a value
// head size apart from q's and k's (MLA's 192 / 128 in the perf shapes). The reference
// is a direct float64 softmax(Q K^T * scale + mask) V sharing no code with the kernels. On CUDA the
// te_attention/ cases run the default implementation choice (cuDNN's fused attention at bfloat16 /
// float16 where cuDNN builds a plan, Kiln's kernels otherwise); te_attention_kiln/ force Kiln's
// kernels, so both stay covered. te_attention/dropout_* run the fused attention dropout at a fixed
// (seed, offset), so the op is deterministic and smooth in q, k and v; their reference applies the
// mask nn-level dropout draws for a [B, Hq, T, S] tensor of ones at that (seed, offset) (the
// Bernoulli random kernel, no code shared with the attention kernels).
#include <cmath>
#include <limits>

#include "harness.h"
#include "kiln/autograd/functions.h"
#include "kiln/te/attention.h"

namespace kiln::backend_ops {

namespace cases_te_attention {

// `mask`: none (undefined), or [B, Hq, T, S] factors (0 or 1 / (1 - p)) on the probabilities.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const Tensor& mask = {}) {
  const std::int64_t B = q.shape()[0], T = q.shape()[1], Hq = q.shape()[2], D = q.shape()[3];
  const std::int64_t S = k.shape()[1], Hkv = k.shape()[2], G = Hq / Hkv, Dv = v.shape()[3];
  const auto qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
  const std::vector<double> mv = mask.defined() ? mask.to_vector<double>() : std::vector<double>();
  std::vector<double> out(static_cast<std::size_t>(B * T * Hq * Dv), 0.0), p(static_cast<std::size_t>(S));
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t h = 0; h < Hq; ++h) {
        const double* qr = &qv[static_cast<std::size_t>(((b * T + i) * Hq + h) * D)];
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < S; ++j) {
          const double* kr = &kv[static_cast<std::size_t>(((b * S + j) * Hkv + h / G) * D)];
          double s = 0;
          for (std::int64_t d = 0; d < D; ++d) s += qr[d] * kr[d];
          p[j] = (!causal || j <= i + S - T) ? s * scale : -std::numeric_limits<double>::infinity();
          mx = std::max(mx, p[j]);
        }
        if (std::isinf(mx)) continue;  // no visible key: zero output
        double sum = 0;
        for (std::int64_t j = 0; j < S; ++j) sum += (p[j] = std::exp(p[j] - mx));
        double* o = &out[static_cast<std::size_t>(((b * T + i) * Hq + h) * Dv)];
        for (std::int64_t j = 0; j < S; ++j) {
          const double* vr = &vv[static_cast<std::size_t>(((b * S + j) * Hkv + h / G) * Dv)];
          const double m = mv.empty() ? 1.0 : mv[static_cast<std::size_t>(((b * Hq + h) * T + i) * S + j)];
          for (std::int64_t d = 0; d < Dv; ++d) o[d] += p[j] / sum * m * vr[d];
        }
      }
  return Tensor::from_vector(out, {B, T, Hq, Dv});
}

struct AttnShape {
  std::int64_t B, T, S, Hq, Hkv, D;
  std::int64_t Dv = 0;  // the value head size; 0: D
  std::int64_t value_dim() const { return Dv > 0 ? Dv : D; }
};

OpCase attention_case(std::string name, AttnShape small, AttnShape large, bool causal, std::uint64_t seed,
                      te::AttentionImpl impl = te::AttentionImpl::Auto) {
  OpCase c;
  c.name = std::move(name);
  c.kernels = {te::kAttentionForwardOp, te::kAttentionBackwardOp};
  c.dtypes = {DType::F32, DType::BF16, DType::F16};
  c.inputs = [=](bool big) {
    const AttnShape s = big ? large : small;
    return std::vector<Tensor>{randn({s.B, s.T, s.Hq, s.D}, seed), randn({s.B, s.S, s.Hkv, s.D}, seed + 1),
                               randn({s.B, s.S, s.Hkv, s.value_dim()}, seed + 2)};
  };
  c.forward = [causal, impl](const std::vector<Tensor>& in) {
    te::AttentionOptions o;
    o.causal = causal;
    o.impl = impl;
    return std::vector<Tensor>{te::attention(in[0], in[1], in[2], o)};
  };
  c.grad_inputs = {0, 1, 2};
  c.reference = [causal](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{naive_attention(in[0], in[1], in[2], causal)};
  };
  return c;
}

// Attention with dropout p at a fixed (seed, offset): Auto, which keeps dropout on Kiln's kernels.
OpCase dropout_case(std::string name, AttnShape small, AttnShape large, bool causal, double p, std::uint64_t seed) {
  OpCase c = attention_case(std::move(name), small, large, causal, seed);
  constexpr std::uint64_t kMaskSeed = 4242, kMaskOffset = 1u << 20;
  c.forward = [causal, p](const std::vector<Tensor>& in) {
    te::AttentionOptions o;
    o.causal = causal;
    o.dropout = p;
    o.dropout_seed = kMaskSeed;
    o.dropout_offset = kMaskOffset;
    return std::vector<Tensor>{te::attention(in[0], in[1], in[2], o)};
  };
  c.reference = [causal, p](const std::vector<Tensor>& in) {
    const Tensor ones =
        Tensor::ones({in[0].shape()[0], in[0].shape()[2], in[0].shape()[1], in[1].shape()[1]}, DType::F64);
    return std::vector<Tensor>{
        naive_attention(in[0], in[1], in[2], causal, dropout(ones, p, true, kMaskSeed, kMaskOffset))};
  };
  return c;
}

}  // namespace cases_te_attention

void add_te_attention_cases(std::vector<OpCase>& cases) {
  using namespace cases_te_attention;  // this file's helpers (a named namespace: the tests compile in unity batches)
  cases.push_back(
      attention_case("te_attention/causal_gqa_d16", {2, 13, 13, 4, 2, 16}, {2, 512, 512, 16, 4, 64}, true, 1700));
  cases.push_back(
      attention_case("te_attention/kv_cache_d64", {1, 5, 19, 2, 1, 64}, {4, 128, 1024, 16, 4, 64}, true, 1710));
  cases.push_back(
      attention_case("te_attention/full_mqa_d128", {1, 3, 5, 2, 1, 128}, {1, 512, 512, 16, 1, 128}, false, 1720));
  const auto kiln = te::AttentionImpl::Kiln;
  cases.push_back(attention_case("te_attention_kiln/causal_gqa_d16", {2, 13, 13, 4, 2, 16}, {2, 512, 512, 16, 4, 64},
                                 true, 1730, kiln));
  cases.push_back(attention_case("te_attention_kiln/kv_cache_d64", {1, 5, 19, 2, 1, 64}, {4, 128, 1024, 16, 4, 64},
                                 true, 1740, kiln));
  cases.push_back(attention_case("te_attention_kiln/full_mqa_d128", {1, 3, 5, 2, 1, 128}, {1, 512, 512, 16, 1, 128},
                                 false, 1750, kiln));
  // MLA: q and k of 24 channels (192 in the perf shapes), v of 16 (128).
  cases.push_back(attention_case("te_attention/mla_dqk24_dv16", {2, 11, 11, 4, 4, 24, 16},
                                 {2, 1024, 1024, 16, 16, 192, 128}, true, 1760));
  cases.push_back(attention_case("te_attention_kiln/mla_dqk24_dv16", {2, 11, 11, 4, 4, 24, 16},
                                 {2, 1024, 1024, 16, 16, 192, 128}, true, 1770, kiln));
  cases.push_back(attention_case("te_attention_kiln/dqk8_dv24_gqa", {1, 7, 9, 4, 2, 8, 24},
                                 {2, 512, 512, 16, 4, 64, 128}, true, 1780, kiln));
  cases.push_back(dropout_case("te_attention/dropout_causal_gqa_d16", {2, 13, 13, 4, 2, 16}, {2, 512, 512, 16, 4, 64},
                               true, 0.1, 1790));
  cases.push_back(dropout_case("te_attention/dropout_full_d64", {1, 9, 21, 2, 1, 64}, {4, 1024, 1024, 12, 12, 64},
                               false, 0.3, 1800));
}

}  // namespace kiln::backend_ops
