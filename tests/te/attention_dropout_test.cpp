// te::attention's fused attention dropout: the CPU kernel against a float64 reference built from
// the same mask (nn-level dropout's Bernoulli mask of the [B, Hq, T, S] probabilities), gradients by
// finite differences with a fixed mask, p = 0 giving the dropout-free results exactly, the kept
// fraction, the mask's dependence on (seed, offset), the device-counter offset, Kiln's CUDA kernels
// against the CPU one (mask bit for bit, values within tolerance), and cuDNN's fused dropout (its
// own generator's mask: one draw for the forward and the backward, the kept fraction, the float64
// reference with that mask). The CUDA tests skip without a device.
#include "kiln/te/attention_dropout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/gradcheck.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"
#include "kiln/te/attention.h"
#include "kiln/tensor/grad_mode.h"
#include "te_test_util.h"

namespace kiln::te {
namespace attention_dropout_test {

struct Case {
  std::int64_t B, T, S, Hq, Hkv, D;
  bool causal;
  double p;
  std::uint64_t seed = 1234, offset = 0;
  std::string name() const {
    return fmt::format("B{} T{} S{} Hq{} Hkv{} D{} {} p={}", B, T, S, Hq, Hkv, D, causal ? "causal" : "full", p);
  }
  std::int64_t probs() const { return B * Hq * T * S; }
};

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

// The mask as the local attention path draws it: nn-level dropout of a [B, Hq, T, S] tensor of ones
// at (seed, offset), i.e. 0 or 1 / (1 - p) per probability (the Bernoulli random kernel: nothing of
// the attention kernels' indexing).
std::vector<double> dropout_mask(const Case& c) {
  const Tensor ones = Tensor::ones({c.B, c.Hq, c.T, c.S}, DType::F64);
  return dropout(ones, c.p, true, c.seed, c.offset).to_vector<double>();
}

// softmax(Q K^T scale + causal mask) with the whole row materialised, then the dropout mask M
// (0 or 1 / (1 - p)): O = (P M) V; backward dV = (P M)^T dO, dP = (dO V^T) M, dS = P (dP - sum_j P dP),
// dQ = scale dS K, dK = scale dS^T Q. float64 throughout.
Result reference(const Case& c, const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v, const std::vector<double>& dout, const std::vector<double>& mask) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const std::int64_t G = c.Hq / c.Hkv;
  Result r;
  r.out.assign(q.size(), 0);
  r.dq.assign(q.size(), 0);
  r.dk.assign(k.size(), 0);
  r.dv.assign(v.size(), 0);
  r.lse.assign(static_cast<std::size_t>(c.B * c.Hq * c.T), 0);
  auto qi = [&](std::int64_t b, std::int64_t i, std::int64_t h) { return ((b * c.T + i) * c.Hq + h) * c.D; };
  auto ki = [&](std::int64_t b, std::int64_t j, std::int64_t h) { return ((b * c.S + j) * c.Hkv + h) * c.D; };
  std::vector<double> p(static_cast<std::size_t>(c.S)), dp(static_cast<std::size_t>(c.S));
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.Hq; ++h)
      for (std::int64_t i = 0; i < c.T; ++i) {
        const std::int64_t hk = h / G;
        const double* m = &mask[static_cast<std::size_t>(((b * c.Hq + h) * c.T + i) * c.S)];
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < c.S; ++j) {
          const bool visible = !c.causal || j <= i + c.S - c.T;
          double dot = 0;
          for (std::int64_t d = 0; d < c.D; ++d) dot += q[qi(b, i, h) + d] * k[ki(b, j, hk) + d];
          p[j] = visible ? dot * scale : -std::numeric_limits<double>::infinity();
          mx = std::max(mx, p[j]);
        }
        double& lse = r.lse[static_cast<std::size_t>((b * c.Hq + h) * c.T + i)];
        if (std::isinf(mx)) {
          lse = -std::numeric_limits<double>::infinity();
          continue;
        }
        double sum = 0;
        for (std::int64_t j = 0; j < c.S; ++j) sum += std::exp(p[j] - mx);
        lse = mx + std::log(sum);  // the undropped softmax's
        for (std::int64_t j = 0; j < c.S; ++j) p[j] = std::exp(p[j] - mx) / sum;
        for (std::int64_t j = 0; j < c.S; ++j)
          for (std::int64_t d = 0; d < c.D; ++d) r.out[qi(b, i, h) + d] += p[j] * m[j] * v[ki(b, j, hk) + d];
        double rowsum = 0;
        for (std::int64_t j = 0; j < c.S; ++j) {
          dp[j] = 0;
          for (std::int64_t d = 0; d < c.D; ++d) dp[j] += dout[qi(b, i, h) + d] * v[ki(b, j, hk) + d];
          dp[j] *= m[j];
          rowsum += dp[j] * p[j];
        }
        for (std::int64_t j = 0; j < c.S; ++j) {
          const double ds = p[j] * (dp[j] - rowsum);
          for (std::int64_t d = 0; d < c.D; ++d) {
            r.dv[ki(b, j, hk) + d] += p[j] * m[j] * dout[qi(b, i, h) + d];
            r.dq[qi(b, i, h) + d] += scale * ds * k[ki(b, j, hk) + d];
            r.dk[ki(b, j, hk) + d] += scale * ds * q[qi(b, i, h) + d];
          }
        }
      }
  return r;
}

struct Inputs {
  Tensor q, k, v, dout;
};
Inputs make_inputs(const Case& c, std::uint64_t seed) {
  return {Tensor::randn({c.B, c.T, c.Hq, c.D}, seed, DType::F64),
          Tensor::randn({c.B, c.S, c.Hkv, c.D}, seed + 1, DType::F64),
          Tensor::randn({c.B, c.S, c.Hkv, c.D}, seed + 2, DType::F64),
          Tensor::randn({c.B, c.T, c.Hq, c.D}, seed + 3, DType::F64)};
}

AttentionOptions options_of(const Case& c, AttentionImpl impl = AttentionImpl::Auto) {
  AttentionOptions o;
  o.impl = impl;
  o.causal = c.causal;
  o.dropout = c.p;
  o.dropout_seed = c.seed;
  o.dropout_offset = c.offset;
  return o;
}

// Forward with the autograd record and backward at `dtype` on `device`, as float64 host vectors.
Result run(const Case& c, const Inputs& in, DType dtype, Device device, const AttentionOptions& o) {
  Tensor q = in.q.to(device, dtype).detach().requires_grad_(true);
  Tensor k = in.k.to(device, dtype).detach().requires_grad_(true);
  Tensor v = in.v.to(device, dtype).detach().requires_grad_(true);
  Tensor out = attention(q, k, v, o);
  out.backward(in.dout.to(device, dtype));
  Result r;
  if (!q.grad().defined() || !k.grad().defined() || !v.grad().defined()) {
    ADD_FAILURE() << "no gradient reached q, k or v";
    return r;
  }
  r.out = out.to_vector<double>();
  r.dq = q.grad().to_vector<double>();
  r.dk = k.grad().to_vector<double>();
  r.dv = v.grad().to_vector<double>();
  NoGradGuard no_grad;
  r.lse = attention_forward(q, k, v, o).second.to_vector<double>();
  return r;
}
Result run(const Case& c, const Inputs& in, DType dtype, Device device, AttentionImpl impl = AttentionImpl::Auto) {
  return run(c, in, dtype, device, options_of(c, impl));
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    m = std::max(m, std::abs(a[i] - b[i]));
  }
  return m;
}
double magnitude(const std::vector<double>& v) {
  double m = 1;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}
void expect_close(const Result& got, const Result& want, double tol, const std::string& what) {
  EXPECT_LE(max_abs_diff(got.out, want.out), tol * magnitude(want.out)) << what << ": output";
  EXPECT_LE(max_abs_diff(got.lse, want.lse), tol * magnitude(want.lse)) << what << ": logsumexp";
  EXPECT_LE(max_abs_diff(got.dq, want.dq), tol * magnitude(want.dq)) << what << ": grad q";
  EXPECT_LE(max_abs_diff(got.dk, want.dk), tol * magnitude(want.dk)) << what << ": grad k";
  EXPECT_LE(max_abs_diff(got.dv, want.dv), tol * magnitude(want.dv)) << what << ": grad v";
}
void expect_identical(const Result& a, const Result& b, const std::string& what) {
  EXPECT_EQ(a.out, b.out) << what << ": output";
  EXPECT_EQ(a.lse, b.lse) << what << ": logsumexp";
  EXPECT_EQ(a.dq, b.dq) << what << ": grad q";
  EXPECT_EQ(a.dk, b.dk) << what << ": grad k";
  EXPECT_EQ(a.dv, b.dv) << what << ": grad v";
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {2, 37, 37, 4, 4, 16, true, 0.1},     // multi-head, T not a multiple of the tiles
      {1, 19, 83, 6, 2, 32, true, 0.5},     // GQA, T < S: bottom-right causal
      {2, 70, 70, 4, 1, 8, false, 0.3},     // MQA, non-causal, crossing the 64-key tile
      {1, 5, 3, 2, 1, 8, true, 0.2},        // T > S causal: rows that see no key
      {1, 130, 130, 2, 2, 12, true, 0.15},  // several query and key tiles
  };
  return all;
}

TEST(TeAttentionDropout, CpuMatchesFloat64ReferenceWithTheSameMask) {
  std::uint64_t seed = 100;
  for (Case c : cases()) {
    c.offset = seed * 1000;  // a non-zero stream position
    const Inputs in = make_inputs(c, seed += 10);
    const Result want = reference(c, in.q.to_vector<double>(), in.k.to_vector<double>(), in.v.to_vector<double>(),
                                  in.dout.to_vector<double>(), dropout_mask(c));
    expect_close(run(c, in, DType::F64, Device::cpu()), want, 1e-11, c.name() + " float64");
    expect_close(run(c, in, DType::F32, Device::cpu()), want, 1e-5, c.name() + " float32");
  }
}

// A different head size for v than for q and k (MLA): te::attention zero-pads for Kiln's kernels;
// the mask is indexed by (b, h, i, j) only, so the padding changes nothing.
TEST(TeAttentionDropout, ValueHeadSizeMayDiffer) {
  const Case c{1, 9, 9, 4, 2, 12, true, 0.3, 99, 5};
  const Inputs in = make_inputs(c, 600);
  const Tensor v6 = in.v.narrow(3, 0, 6).contiguous();
  const AttentionOptions o = options_of(c);
  const Tensor out = attention(in.q, in.k, v6, o);
  const Result want = reference(c, in.q.to_vector<double>(), in.k.to_vector<double>(), in.v.to_vector<double>(),
                                in.dout.to_vector<double>(), dropout_mask(c));
  // The reference ran with the full 12 channels of v: its first 6 output channels are v6's.
  const std::vector<double> got = out.to_vector<double>();
  double worst = 0;
  for (std::int64_t row = 0; row < c.B * c.T * c.Hq; ++row)
    for (std::int64_t d = 0; d < 6; ++d)
      worst = std::max(worst, std::abs(got[static_cast<std::size_t>(row * 6 + d)] -
                                       want.out[static_cast<std::size_t>(row * 12 + d)]));
  EXPECT_LE(worst, 1e-11);
}

TEST(TeAttentionDropout, GradientsMatchFiniteDifferencesWithAFixedMask) {
  // A fixed (seed, offset): every call of the function draws the same mask, so it is a smooth
  // function of q, k and v that finite differences can check.
  std::uint64_t seed = 500;
  for (const Case& c : std::vector<Case>{{1, 5, 5, 2, 2, 4, true, 0.3, 7, 3},
                                         {2, 3, 7, 4, 2, 3, true, 0.5, 8, 0},
                                         {1, 6, 4, 3, 1, 5, false, 0.2, 9, 11}}) {
    const Inputs in = make_inputs(c, seed += 10);
    const AttentionOptions o = options_of(c);
    auto f = [&](const std::vector<Tensor>& x) { return attention(x[0], x[1], x[2], o); };
    autograd::GradcheckResult g = autograd::gradcheck(f, {in.q.clone(), in.k.clone(), in.v.clone()}, 1e-6, 1e-7, 1e-5);
    EXPECT_TRUE(g.ok) << c.name() << ": " << g.message;
  }
}

TEST(TeAttentionDropout, ZeroProbabilityGivesTheDropoutFreeResultsExactly) {
  std::uint64_t seed = 800;
  for (Case c : cases()) {
    c.p = 0;
    const Inputs in = make_inputs(c, seed += 10);
    AttentionOptions plain;
    plain.causal = c.causal;
    for (DType t : {DType::F64, DType::F32, DType::BF16})
      expect_identical(run(c, in, t, Device::cpu()), run(c, in, t, Device::cpu(), plain),
                       c.name() + " " + std::string(dtype_name(t)));
  }
}

TEST(TeAttentionDropout, ProbabilityOneZeroesOutputAndGradients) {
  const Case c{2, 6, 6, 2, 1, 4, true, 1.0};
  const Result r = run(c, make_inputs(c, 900), DType::F32, Device::cpu());
  for (const auto* v : {&r.out, &r.dq, &r.dk, &r.dv})
    for (double x : *v) ASSERT_EQ(x, 0.0);
}

// The keep rule over 2^22 counters: the kept fraction is 1 - p within 6 standard deviations of a
// binomial count (the seed is fixed, so the test is deterministic; the bound is that of a fair
// generator), for several p, and the integer threshold is exactly `u < 1 - p` of the Bernoulli kernel.
TEST(TeAttentionDropout, KeptFractionIsOneMinusP) {
  constexpr std::uint64_t n = 1u << 22;
  for (double p : {0.1, 0.5, 0.9}) {
    const std::uint32_t threshold = attention_dropout_threshold(p);
    std::uint64_t kept = 0;
    for (std::uint64_t i = 0; i < n; ++i) kept += attention_dropout_keep(42, 1000 + i, threshold) ? 1 : 0;
    const double expected = (1 - p) * static_cast<double>(n);
    const double sigma = std::sqrt(static_cast<double>(n) * p * (1 - p));
    EXPECT_NEAR(static_cast<double>(kept), expected, 6 * sigma) << "p=" << p;
  }
  for (double p : {0.0, 0.1, 0.25, 1.0 / 3.0, 0.9, 1.0}) {
    const std::uint32_t threshold = attention_dropout_threshold(p);
    for (std::uint64_t i = 0; i < 4096; ++i) {
      const bool bernoulli = ops::random_uniform(5, i) < 1.0 - p;  // ops/cpu/copy_fill.cpp's rule
      ASSERT_EQ(attention_dropout_keep(5, i, threshold), bernoulli) << "p=" << p << " counter " << i;
    }
  }
}

// The same (seed, offset): the same mask, call after call (and the backward regenerates it); the
// offset advanced past the previous call's B Hq T S counters, or another seed: another mask.
TEST(TeAttentionDropout, MaskIsAFunctionOfSeedAndOffset) {
  Case c{2, 20, 20, 2, 2, 8, true, 0.4, 31, 64};
  const Inputs in = make_inputs(c, 1000);
  const Result first = run(c, in, DType::F32, Device::cpu());
  expect_identical(run(c, in, DType::F32, Device::cpu()), first, "same seed and offset");
  Case advanced = c;
  advanced.offset += static_cast<std::uint64_t>(c.probs());
  const Result next = run(advanced, in, DType::F32, Device::cpu());
  EXPECT_NE(next.out, first.out) << "the offset advanced: another mask";
  EXPECT_NE(dropout_mask(advanced), dropout_mask(c));
  Case reseeded = c;
  reseeded.seed = 32;
  EXPECT_NE(run(reseeded, in, DType::F32, Device::cpu()).out, first.out) << "another seed: another mask";
  // And each run is the reference of its own mask.
  const Result want = reference(advanced, in.q.to_vector<double>(), in.k.to_vector<double>(), in.v.to_vector<double>(),
                                in.dout.to_vector<double>(), dropout_mask(advanced));
  expect_close(next, want, 1e-5, "advanced offset");
}

// nn::Dropout's graph-safe mode keeps the offset in an int64 counter on the device: the kernels add
// its value when they run. Same results as the host offset.
TEST(TeAttentionDropout, DeviceCounterOffsetEqualsTheHostOffset) {
  Case c{1, 12, 12, 2, 1, 8, true, 0.3, 5, 0};
  const Inputs in = make_inputs(c, 1100);
  Case host = c;
  host.offset = 777;
  AttentionOptions counted = options_of(c);
  counted.dropout_offset = 700;
  counted.dropout_offset_counter = Tensor::scalar(77, DType::I64);
  expect_identical(run(c, in, DType::F32, Device::cpu(), counted), run(host, in, DType::F32, Device::cpu()),
                   "offset 700 + counter 77 against offset 777");
}

TEST(TeAttentionDropout, RefusesBadDropoutOptions) {
  const Case c{1, 4, 4, 2, 2, 8, true, 0.1};
  const Inputs in = make_inputs(c, 1300);
  auto refused = [&](const AttentionOptions& o, const std::string& mention) {
    try {
      (void)attention(in.q, in.k, in.v, o);
      ADD_FAILURE() << "not refused: " << mention;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
    }
  };
  AttentionOptions o = options_of(c);
  o.dropout = 1.5;
  refused(o, "dropout must be in [0, 1]");
  o.dropout = -0.1;
  refused(o, "dropout must be in [0, 1]");
  o = options_of(c);
  o.dropout_offset_counter = Tensor::scalar(3, DType::F32);
  refused(o, "dropout_offset_counter");
}

// ---- CUDA against the CPU -----------------------------------------------------------------------

bool have_cuda() { return device_count(DeviceKind::CUDA) > 0; }
using te_test::nmse;

// The mask itself, read off the outputs: q = k = 0 makes every visible probability 1 / n_i; with
// v[j] = e_j for every key/value head (head dim = S) the output's channel j of row i of query head h
// is M_hij / n_i, and with dO[i] = e_i (head dim = T) dV's channel i of key j is M_ij / n_i when
// Hq = Hkv (no sum over a group; with grouped heads the backward mask is not read). Returns
// {forward mask, backward mask} as kept flags in [B, Hq, T, S] order.
std::pair<std::vector<bool>, std::vector<bool>> probe_mask(const Case& c, DType t, Device device,
                                                           AttentionImpl impl = AttentionImpl::Auto) {
  const std::int64_t D = c.S;  // == c.T
  std::vector<double> v(static_cast<std::size_t>(c.B * c.S * c.Hkv * D), 0.0),
      dout(static_cast<std::size_t>(c.B * c.T * c.Hq * D), 0.0);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t j = 0; j < c.S; ++j) {
      for (std::int64_t h = 0; h < c.Hkv; ++h) v[static_cast<std::size_t>(((b * c.S + j) * c.Hkv + h) * D + j)] = 1;
      for (std::int64_t h = 0; h < c.Hq; ++h) dout[static_cast<std::size_t>(((b * c.T + j) * c.Hq + h) * D + j)] = 1;
    }
  Tensor q = Tensor::zeros({c.B, c.T, c.Hq, D}, t, device).requires_grad_(true);
  Tensor k = Tensor::zeros({c.B, c.S, c.Hkv, D}, t, device).requires_grad_(true);
  Tensor vt = Tensor::from_vector(v, {c.B, c.S, c.Hkv, D}).to(device, t).requires_grad_(true);
  Tensor out = attention(q, k, vt, options_of(c, impl));
  out.backward(Tensor::from_vector(dout, {c.B, c.T, c.Hq, D}).to(device, t));
  const std::vector<double> o = out.to_vector<double>(), dv = vt.grad().to_vector<double>();
  std::vector<bool> fwd(static_cast<std::size_t>(c.probs())), bwd(fwd.size());
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.Hq; ++h)
      for (std::int64_t i = 0; i < c.T; ++i)
        for (std::int64_t j = 0; j < c.S; ++j) {
          const std::size_t at = static_cast<std::size_t>(((b * c.Hq + h) * c.T + i) * c.S + j);
          fwd[at] = o[static_cast<std::size_t>(((b * c.T + i) * c.Hq + h) * D + j)] > 0;
          if (c.Hq == c.Hkv) bwd[at] = dv[static_cast<std::size_t>(((b * c.S + j) * c.Hkv + h) * D + i)] > 0;
        }
  return {fwd, bwd};
}

// On the CPU the probe's mask is the Bernoulli kernel's (nn::Dropout's on the local path), forward
// and backward, at the visible positions.
TEST(TeAttentionDropout, CpuMaskIsTheLocalDropoutMask) {
  const Case c{2, 64, 64, 2, 2, 64, false, 0.3, 17, 4096};
  const std::vector<double> want = dropout_mask(c);
  for (DType t : {DType::F32, DType::BF16}) {
    const auto [fwd, bwd] = probe_mask(c, t, Device::cpu());
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(fwd[i], want[i] > 0) << dtype_name(t) << " forward, probability " << i;
      ASSERT_EQ(bwd[i], want[i] > 0) << dtype_name(t) << " backward, probability " << i;
    }
  }
}

// The CUDA kernels' masks bit for bit against the CPU's: the tensor-core forward (mma.sync, and the
// WMMA one), the tensor-core backward (bf16 / f16, head dim 64), and the SIMT kernels (float32, and
// 16-bit forced to SIMT).
TEST(TeAttentionDropoutCuda, MasksEqualTheCpuMaskBitForBit) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  for (bool causal : {false, true}) {
    const Case c{2, 64, 64, 2, 2, 64, causal, 0.3, 17, 4096};
    const auto cpu = probe_mask(c, DType::F32, Device::cpu());
    auto expect_equal = [&](DType t, const char* path) {
      const auto gpu = probe_mask(c, t, Device::cuda(0), AttentionImpl::Kiln);
      EXPECT_TRUE(gpu.first == cpu.first) << path << " " << dtype_name(t) << " forward mask";
      EXPECT_TRUE(gpu.second == cpu.second) << path << " " << dtype_name(t) << " backward mask";
    };
    // Auto keeps dropout on Kiln's kernels (cuDNN's generator runs only when asked for).
    const auto automatic = probe_mask(c, DType::BF16, Device::cuda(0));
    EXPECT_TRUE(automatic.first == cpu.first && automatic.second == cpu.second) << "Auto's bf16 masks";
    for (DType t : {DType::BF16, DType::F16}) {
      expect_equal(t, "tensor cores (mma.sync)");
      {
        const te_test::ScopedEnv wmma("KILN_ATTENTION_MMA", "0");
        expect_equal(t, "tensor cores (WMMA)");
      }
      const te_test::ScopedEnv simt("KILN_ATTENTION_SIMT", "1");
      expect_equal(t, "SIMT");
    }
    expect_equal(DType::F32, "SIMT");
    expect_equal(DType::F64, "SIMT");
  }
}

void expect_cuda_matches_cpu(const Case& c, DType t, std::uint64_t seed, double tol) {
  const Inputs in = make_inputs(c, seed);
  const Result cpu = run(c, in, t, Device::cpu());
  const Result gpu = run(c, in, t, Device::cuda(0), AttentionImpl::Kiln);
  const std::string what = c.name() + " " + std::string(dtype_name(t));
  EXPECT_LE(nmse(gpu.out, cpu.out), tol) << what << ": output";
  EXPECT_LE(nmse(gpu.lse, cpu.lse), tol) << what << ": logsumexp";
  EXPECT_LE(nmse(gpu.dq, cpu.dq), tol) << what << ": grad q";
  EXPECT_LE(nmse(gpu.dk, cpu.dk), tol) << what << ": grad k";
  EXPECT_LE(nmse(gpu.dv, cpu.dv), tol) << what << ": grad v";
}

// Values: the tensor-core kernels at bf16 / f16 (head dims 64, 128), and the SIMT kernels at f64 /
// f32 on the CPU cases (Kiln's kernels asked for by name).
TEST(TeAttentionDropoutCuda, KernelsMatchCpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  std::uint64_t seed = 2000;
  for (DType t : {DType::BF16, DType::F16})
    for (const Case& c : std::vector<Case>{{2, 128, 128, 4, 4, 64, true, 0.1},
                                           {1, 200, 200, 8, 2, 128, true, 0.3},
                                           {2, 77, 141, 4, 1, 64, true, 0.5},
                                           {1, 96, 96, 2, 2, 128, false, 0.2}})
      expect_cuda_matches_cpu(c, t, seed += 10, t == DType::BF16 ? 1e-4 : 1e-5);
  for (const Case& c : cases()) {
    expect_cuda_matches_cpu(c, DType::F64, seed += 10, 1e-24);
    expect_cuda_matches_cpu(c, DType::F32, seed += 10, 1e-10);
  }
}

// The graph-safe device counter on the device (Kiln's kernels and cuDNN's generator: offset 700 +
// counter 77 draws offset 777's mask), and gradients by finite differences there.
TEST(TeAttentionDropoutCuda, DeviceCounterAndFiniteDifferences) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const Device d = Device::cuda(0);
  Case c{1, 70, 70, 2, 1, 64, true, 0.3, 5, 0};
  const Inputs in = make_inputs(c, 2100);
  Case host = c;
  host.offset = 777;
  for (AttentionImpl impl : {AttentionImpl::Kiln, AttentionImpl::Cudnn}) {
    AttentionOptions counted = options_of(c, impl);
    counted.dropout_offset = 700;
    counted.dropout_offset_counter = Tensor::scalar(77, DType::I64, d);
    const Result a = run(c, in, DType::BF16, d, counted), b = run(host, in, DType::BF16, d, impl);
    const std::string what = impl == AttentionImpl::Kiln ? "device counter, Kiln's kernels" : "device counter, cuDNN";
    if (impl == AttentionImpl::Kiln) {
      expect_identical(a, b, what);
    } else {  // cuDNN's backward may sum dQ in another order from run to run: the mask shows in the output
      EXPECT_EQ(a.out, b.out) << what;
      EXPECT_LE(nmse(a.dq, b.dq), 1e-10) << what;
      EXPECT_LE(nmse(a.dv, b.dv), 1e-10) << what;
    }
  }
  const Case small{2, 3, 7, 4, 2, 3, true, 0.4, 9, 2};
  const Inputs si = make_inputs(small, 2200);
  const AttentionOptions o = options_of(small);
  auto f = [&](const std::vector<Tensor>& x) { return attention(x[0], x[1], x[2], o); };
  autograd::GradcheckResult g = autograd::gradcheck(f, {si.q.to(d), si.k.to(d), si.v.to(d)}, 1e-6, 1e-7, 1e-5);
  EXPECT_TRUE(g.ok) << g.message;
}

// ---- cuDNN's fused dropout (its own generator) ---------------------------------------------------

// The positions a causal row i sees (T == S here).
bool visible(const Case& c, std::int64_t at) {
  const std::int64_t j = at % c.S, i = (at / c.S) % c.T;
  return !c.causal || j <= i + c.S - c.T;
}

// cuDNN's mask is one draw per (seed, offset): the forward's and the backward's agree at every
// visible probability, a second call draws it again, the kept fraction is 1 - p, masked-out keys
// stay out, and another offset or seed draws another mask.
TEST(TeAttentionDropoutCudnn, OneMaskForTheForwardAndTheBackward) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const Device d = Device::cuda(0);
  for (bool causal : {false, true}) {
    const Case c{2, 64, 64, 2, 2, 64, causal, 0.3, 17, 4096};
    const auto [fwd, bwd] = probe_mask(c, DType::BF16, d, AttentionImpl::Cudnn);
    std::int64_t seen = 0, kept = 0, disagree = 0, leaked = 0;
    for (std::int64_t at = 0; at < c.probs(); ++at) {
      const auto i = static_cast<std::size_t>(at);
      if (!visible(c, at)) {
        leaked += fwd[i] || bwd[i];
        continue;
      }
      ++seen;
      kept += fwd[i];
      disagree += fwd[i] != bwd[i];
    }
    const std::string what = causal ? "causal" : "full";
    EXPECT_EQ(disagree, 0) << what << ": the backward's mask differs from the forward's";
    EXPECT_EQ(leaked, 0) << what << ": probabilities above the causal diagonal were kept";
    const double fraction = static_cast<double>(kept) / static_cast<double>(seen);
    EXPECT_NEAR(fraction, 0.7, 0.04) << what << ": kept fraction over " << seen << " probabilities";
    EXPECT_TRUE(probe_mask(c, DType::BF16, d, AttentionImpl::Cudnn).first == fwd) << what << ": a second draw";
    auto differing = [&](const Case& other) {
      const auto mask = probe_mask(other, DType::BF16, d, AttentionImpl::Cudnn).first;
      std::int64_t n = 0;
      for (std::int64_t at = 0; at < c.probs(); ++at)
        n += visible(c, at) && mask[static_cast<std::size_t>(at)] != fwd[static_cast<std::size_t>(at)];
      return static_cast<double>(n) / static_cast<double>(seen);
    };
    Case next = c;
    next.offset += static_cast<std::uint64_t>(c.probs());  // the next call's offset
    Case reseeded = c;
    reseeded.seed += 1;
    // Two independent masks at keep 0.7 differ at 2 x 0.7 x 0.3 = 42% of the positions.
    EXPECT_GT(differing(next), 0.3) << what << ": the next offset's mask";
    EXPECT_GT(differing(reseeded), 0.3) << what << ": another seed's mask";
  }
}

// Output, logsumexp and gradients of cuDNN's fused dropout against the float64 reference built with
// the mask it draws (read by the probe at the same seed, offset and sizes), at bf16 inputs.
TEST(TeAttentionDropoutCudnn, MatchesTheFloat64ReferenceWithItsOwnMask) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const Device d = Device::cuda(0);
  std::uint64_t seed = 2300;
  for (const Case& c : std::vector<Case>{{2, 64, 64, 2, 2, 64, true, 0.2, 31, 0},
                                         {1, 128, 128, 4, 2, 128, true, 0.1, 32, 1u << 20},
                                         {1, 64, 64, 4, 1, 64, false, 0.5, 33, 7}}) {
    const std::vector<bool> kept = probe_mask(c, DType::BF16, d, AttentionImpl::Cudnn).first;
    std::vector<double> mask(kept.size());
    for (std::size_t i = 0; i < kept.size(); ++i) mask[i] = kept[i] ? 1.0 / (1.0 - c.p) : 0.0;
    Inputs in = make_inputs(c, seed += 10);
    for (Tensor* t : {&in.q, &in.k, &in.v, &in.dout}) *t = t->to(DType::BF16).to(DType::F64);  // the inputs as run
    const Result got = run(c, in, DType::BF16, d, AttentionImpl::Cudnn);
    const Result want = reference(c, in.q.to_vector<double>(), in.k.to_vector<double>(), in.v.to_vector<double>(),
                                  in.dout.to_vector<double>(), mask);
    const std::string what = c.name();
    EXPECT_LE(nmse(got.out, want.out), 1e-4) << what << ": output";
    EXPECT_LE(nmse(got.lse, want.lse), 1e-4) << what << ": logsumexp";
    EXPECT_LE(nmse(got.dq, want.dq), 1e-4) << what << ": grad q";
    EXPECT_LE(nmse(got.dk, want.dk), 1e-4) << what << ": grad k";
    EXPECT_LE(nmse(got.dv, want.dv), 1e-4) << what << ": grad v";
  }
}

}  // namespace attention_dropout_test
}  // namespace kiln::te
