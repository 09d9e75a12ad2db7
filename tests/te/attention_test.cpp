// te::attention against a naive float64 attention (explicit softmax(Q K^T * scale + mask) V and its
// explicit backward), by finite differences at float64, refusals of bad input, and the CUDA kernels
// against the CPU ones (skipped without a device).
#include "kiln/te/attention.h"

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
#include "kiln/tensor/grad_mode.h"
#include "te_test_util.h"

namespace kiln::te {
namespace attention_test {

struct Shape5 {
  std::int64_t B, T, S, Hq, Hkv, D;
  bool causal;
  double scale = 0;  // 0: 1/sqrt(D)
  std::string name() const {
    return fmt::format("B{} T{} S{} Hq{} Hkv{} D{} {}", B, T, S, Hq, Hkv, D, causal ? "causal" : "full");
  }
};

// What the naive reference computes, in float64 on the host.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// softmax(Q K^T * scale + mask) V row by row with the whole score row materialised, and the
// textbook backward: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = scale dS K,
// dK = scale dS^T Q (key/value gradients summed over the query heads of their group).
Reference naive_attention(const Shape5& s, const std::vector<double>& q, const std::vector<double>& k,
                          const std::vector<double>& v, const std::vector<double>& dout) {
  const double scale = s.scale != 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(s.D));
  const std::int64_t G = s.Hq / s.Hkv;
  Reference r;
  r.out.assign(q.size(), 0);
  r.dq.assign(q.size(), 0);
  r.dk.assign(k.size(), 0);
  r.dv.assign(v.size(), 0);
  r.lse.assign(static_cast<std::size_t>(s.B * s.Hq * s.T), 0);
  auto qi = [&](std::int64_t b, std::int64_t i, std::int64_t h) { return ((b * s.T + i) * s.Hq + h) * s.D; };
  auto ki = [&](std::int64_t b, std::int64_t j, std::int64_t h) { return ((b * s.S + j) * s.Hkv + h) * s.D; };
  std::vector<double> p(static_cast<std::size_t>(s.S)), dp(static_cast<std::size_t>(s.S));
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.Hq; ++h)
      for (std::int64_t i = 0; i < s.T; ++i) {
        const std::int64_t hk = h / G;
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < s.S; ++j) {
          const bool visible = !s.causal || j <= i + s.S - s.T;
          double dot = 0;
          for (std::int64_t d = 0; d < s.D; ++d) dot += q[qi(b, i, h) + d] * k[ki(b, j, hk) + d];
          p[j] = visible ? dot * scale : -std::numeric_limits<double>::infinity();
          mx = std::max(mx, p[j]);
        }
        double& lse = r.lse[static_cast<std::size_t>((b * s.Hq + h) * s.T + i)];
        if (std::isinf(mx)) {  // no visible key: zero output and gradients, lse -inf
          lse = -std::numeric_limits<double>::infinity();
          continue;
        }
        double sum = 0;
        for (std::int64_t j = 0; j < s.S; ++j) sum += std::exp(p[j] - mx);
        lse = mx + std::log(sum);
        for (std::int64_t j = 0; j < s.S; ++j) p[j] = std::exp(p[j] - mx) / sum;
        for (std::int64_t j = 0; j < s.S; ++j)
          for (std::int64_t d = 0; d < s.D; ++d) r.out[qi(b, i, h) + d] += p[j] * v[ki(b, j, hk) + d];
        double rowsum = 0;
        for (std::int64_t j = 0; j < s.S; ++j) {
          dp[j] = 0;
          for (std::int64_t d = 0; d < s.D; ++d) dp[j] += dout[qi(b, i, h) + d] * v[ki(b, j, hk) + d];
          rowsum += dp[j] * p[j];
        }
        for (std::int64_t j = 0; j < s.S; ++j) {
          const double ds = p[j] * (dp[j] - rowsum);
          for (std::int64_t d = 0; d < s.D; ++d) {
            r.dv[ki(b, j, hk) + d] += p[j] * dout[qi(b, i, h) + d];
            r.dq[qi(b, i, h) + d] += scale * ds * k[ki(b, j, hk) + d];
            r.dk[ki(b, j, hk) + d] += scale * ds * q[qi(b, i, h) + d];
          }
        }
      }
  return r;
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

struct Inputs {
  Tensor q, k, v, dout;
};
Inputs make_inputs(const Shape5& s, std::uint64_t seed) {
  return {Tensor::randn({s.B, s.T, s.Hq, s.D}, seed, DType::F64),
          Tensor::randn({s.B, s.S, s.Hkv, s.D}, seed + 1, DType::F64),
          Tensor::randn({s.B, s.S, s.Hkv, s.D}, seed + 2, DType::F64),
          Tensor::randn({s.B, s.T, s.Hq, s.D}, seed + 3, DType::F64)};
}

// Runs forward (with the autograd record) and backward at `dtype` on `device`; returns the outputs
// as float64 host vectors in Reference's layout.
Reference run_kiln(const Shape5& s, const Inputs& in, DType dtype, Device device) {
  Tensor q = in.q.to(device, dtype).detach().requires_grad_(true);
  Tensor k = in.k.to(device, dtype).detach().requires_grad_(true);
  Tensor v = in.v.to(device, dtype).detach().requires_grad_(true);
  AttentionOptions o;
  o.causal = s.causal;
  o.softmax_scale = s.scale;
  Tensor out = attention(q, k, v, o);
  EXPECT_EQ(out.shape(), q.shape());
  EXPECT_EQ(out.dtype(), dtype);
  out.backward(in.dout.to(device, dtype));
  Reference r;
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

const std::vector<Shape5>& shapes() {
  static const std::vector<Shape5> all = {
      {2, 37, 37, 4, 4, 64, true},        // multi-head, T not a multiple of any tile
      {1, 19, 83, 6, 2, 128, true},       // GQA, T < S: bottom-right causal (the KV-cache case)
      {2, 70, 70, 4, 1, 16, false},       // MQA, non-causal, crossing the 64-key tile
      {1, 5, 3, 2, 1, 8, true},           // T > S causal: the first two rows see no key
      {1, 9, 12, 2, 2, 256, false, 0.3},  // the largest head dim, an explicit scale
      {1, 130, 130, 2, 2, 40, true},      // several query and key tiles, an odd-sized head dim
      {2, 64, 128, 4, 2, 64, true},       // exact tiles, GQA
  };
  return all;
}

// The largest finite magnitude (at least 1): tolerances are relative to it.
double magnitude(const std::vector<double>& v) {
  double m = 1;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}

void expect_close(const Reference& got, const Reference& want, double tol, const std::string& what) {
  EXPECT_LE(max_abs_diff(got.out, want.out), tol * magnitude(want.out)) << what << ": output";
  EXPECT_LE(max_abs_diff(got.lse, want.lse), tol * magnitude(want.lse)) << what << ": logsumexp";
  EXPECT_LE(max_abs_diff(got.dq, want.dq), tol * magnitude(want.dq)) << what << ": grad q";
  EXPECT_LE(max_abs_diff(got.dk, want.dk), tol * magnitude(want.dk)) << what << ": grad k";
  EXPECT_LE(max_abs_diff(got.dv, want.dv), tol * magnitude(want.dv)) << what << ": grad v";
}

TEST(TeAttention, CpuMatchesNaiveFloat64Reference) {
  std::uint64_t seed = 100;
  for (const Shape5& s : shapes()) {
    const Inputs in = make_inputs(s, seed += 10);
    const Reference want = naive_attention(s, in.q.to_vector<double>(), in.k.to_vector<double>(),
                                           in.v.to_vector<double>(), in.dout.to_vector<double>());
    expect_close(run_kiln(s, in, DType::F64, Device::cpu()), want, 1e-11, s.name() + " float64");
    expect_close(run_kiln(s, in, DType::F32, Device::cpu()), want, 1e-5, s.name() + " float32");
  }
}

// bfloat16 and float16 inputs: the reference sees the same rounded inputs; the kernel accumulates in
// float, so what remains is the rounding of the outputs (and of nothing in between).
TEST(TeAttention, CpuSixteenBitMatchesReferenceOnRoundedInputs) {
  std::uint64_t seed = 300;
  for (DType t : {DType::BF16, DType::F16}) {
    for (const Shape5& s : shapes()) {
      Inputs in = make_inputs(s, seed += 10);
      in = {in.q.to(t).to(DType::F64), in.k.to(t).to(DType::F64), in.v.to(t).to(DType::F64),
            in.dout.to(t).to(DType::F64)};
      const Reference want = naive_attention(s, in.q.to_vector<double>(), in.k.to_vector<double>(),
                                             in.v.to_vector<double>(), in.dout.to_vector<double>());
      // Relative rounding of one 16-bit store (2^-8 for bf16) times the size of the values.
      const double tol = t == DType::BF16 ? 0.03 : 0.004;
      const Reference got = run_kiln(s, in, t, Device::cpu());
      EXPECT_LE(max_abs_diff(got.out, want.out), tol) << s.name();
      EXPECT_LE(max_abs_diff(got.lse, want.lse), 1e-4) << s.name() << " (lse is float32)";
      EXPECT_LE(max_abs_diff(got.dv, want.dv), tol * 8) << s.name();
    }
  }
}

TEST(TeAttention, GradientsMatchFiniteDifferences) {
  const std::vector<Shape5> small = {
      {1, 5, 5, 2, 2, 4, true}, {2, 3, 7, 4, 2, 3, true}, {1, 6, 4, 3, 1, 5, false}, {1, 4, 2, 2, 1, 2, true}};
  std::uint64_t seed = 500;
  for (const Shape5& s : small) {
    const Inputs in = make_inputs(s, seed += 10);
    AttentionOptions o;
    o.causal = s.causal;
    auto f = [&](const std::vector<Tensor>& x) { return attention(x[0], x[1], x[2], o); };
    autograd::GradcheckResult g = autograd::gradcheck(f, {in.q.clone(), in.k.clone(), in.v.clone()}, 1e-6, 1e-7, 1e-5);
    EXPECT_TRUE(g.ok) << s.name() << ": " << g.message;
  }
}

// v's head size apart from q's and k's (MLA's 192 against 128, in miniature; and the other way
// round): Kiln's kernels run on zero-padded operands. Output against softmax(q k^T scale) v in
// float64, the scale 1/sqrt(D) of q's head size, and gradients by finite differences.
TEST(TeAttention, ValueHeadSizeMayDiffer) {
  struct Case {
    std::int64_t B, T, S, Hq, Hkv, D, Dv;
    bool causal;
  };
  std::uint64_t seed = 700;
  for (const Case& c :
       {Case{1, 5, 5, 4, 2, 12, 6, true}, Case{2, 3, 6, 2, 1, 4, 10, true}, Case{1, 4, 4, 3, 3, 8, 5, false}}) {
    const std::string name = fmt::format("B{} T{} S{} Hq{} Hkv{} D{} Dv{} {}", c.B, c.T, c.S, c.Hq, c.Hkv, c.D, c.Dv,
                                         c.causal ? "causal" : "full");
    const Tensor q = Tensor::randn({c.B, c.T, c.Hq, c.D}, seed++, DType::F64);
    const Tensor k = Tensor::randn({c.B, c.S, c.Hkv, c.D}, seed++, DType::F64);
    const Tensor v = Tensor::randn({c.B, c.S, c.Hkv, c.Dv}, seed++, DType::F64);
    AttentionOptions o;
    o.causal = c.causal;
    const Tensor out = attention(q, k, v, o);
    ASSERT_EQ(out.shape(), (Shape{c.B, c.T, c.Hq, c.Dv})) << name;
    const auto qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
    const auto got = out.to_vector<double>();
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    double worst = 0;
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < c.Hq; ++h)
        for (std::int64_t i = 0; i < c.T; ++i) {
          const std::int64_t hk = h / (c.Hq / c.Hkv);
          std::vector<double> p(static_cast<std::size_t>(c.S), 0);
          double mx = -1e300, sum = 0;
          for (std::int64_t j = 0; j < c.S; ++j) {
            if (c.causal && j > i + c.S - c.T) continue;
            double dot = 0;
            for (std::int64_t e = 0; e < c.D; ++e)
              dot += qv[static_cast<std::size_t>(((b * c.T + i) * c.Hq + h) * c.D + e)] *
                     kv[static_cast<std::size_t>(((b * c.S + j) * c.Hkv + hk) * c.D + e)];
            p[static_cast<std::size_t>(j)] = dot * scale;
            mx = std::max(mx, dot * scale);
          }
          for (std::int64_t j = 0; j < c.S; ++j) {
            const bool visible = !c.causal || j <= i + c.S - c.T;
            p[static_cast<std::size_t>(j)] = visible ? std::exp(p[static_cast<std::size_t>(j)] - mx) : 0;
            sum += p[static_cast<std::size_t>(j)];
          }
          for (std::int64_t e = 0; e < c.Dv; ++e) {
            double want = 0;
            for (std::int64_t j = 0; j < c.S; ++j)
              want += p[static_cast<std::size_t>(j)] / sum *
                      vv[static_cast<std::size_t>(((b * c.S + j) * c.Hkv + hk) * c.Dv + e)];
            worst =
                std::max(worst, std::abs(got[static_cast<std::size_t>(((b * c.T + i) * c.Hq + h) * c.Dv + e)] - want));
          }
        }
    EXPECT_LE(worst, 1e-12) << name;
    auto f = [&](const std::vector<Tensor>& x) { return attention(x[0], x[1], x[2], o); };
    const autograd::GradcheckResult g = autograd::gradcheck(f, {q.clone(), k.clone(), v.clone()}, 1e-6, 1e-7, 1e-5);
    EXPECT_TRUE(g.ok) << name << ": " << g.message;
  }
}

TEST(TeAttention, NonContiguousInputsAndReusedGraph) {
  // q, k, v as slices of one fused [B, T, 3, H, D] projection (how a QKV linear lays them out).
  const Shape5 s{2, 11, 11, 3, 3, 8, true};
  Tensor qkv = Tensor::randn({s.B, s.T, 3, s.Hq, s.D}, 7, DType::F64);
  Tensor q = qkv.select(2, 0), k = qkv.select(2, 1), v = qkv.select(2, 2);
  ASSERT_FALSE(q.is_contiguous());
  const Reference want = naive_attention(s, q.contiguous().to_vector<double>(), k.contiguous().to_vector<double>(),
                                         v.contiguous().to_vector<double>(),
                                         std::vector<double>(static_cast<std::size_t>(q.numel()), 1.0));
  qkv.requires_grad_(true);
  Tensor out = attention(qkv.select(2, 0), qkv.select(2, 1), qkv.select(2, 2));
  EXPECT_LE(max_abs_diff(out.to_vector<double>(), want.out), 1e-12);
  sum(out).backward();
  Tensor g = qkv.grad();
  EXPECT_LE(max_abs_diff(g.select(2, 0).contiguous().to_vector<double>(), want.dq), 1e-12);
  EXPECT_LE(max_abs_diff(g.select(2, 1).contiguous().to_vector<double>(), want.dk), 1e-12);
  EXPECT_LE(max_abs_diff(g.select(2, 2).contiguous().to_vector<double>(), want.dv), 1e-12);
}

// Each refusal names te::attention and the operand that is wrong.
void expect_refused(const std::function<void()>& call, const std::vector<std::string>& mentions) {
  try {
    call();
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("te::attention"), std::string::npos) << what;
    for (const auto& m : mentions) EXPECT_NE(what.find(m), std::string::npos) << "'" << m << "' not in: " << what;
  }
}

TEST(TeAttention, RefusesBadInput) {
  const Tensor q = Tensor::zeros({2, 8, 4, 16}), k = Tensor::zeros({2, 8, 2, 16}), v = Tensor::zeros({2, 8, 2, 16});
  expect_refused([&] { (void)attention(Tensor::zeros({8, 4, 16}), k, v); }, {"q must be [B, T, Hq, D]", "[8, 4, 16]"});
  expect_refused([&] { (void)attention(q, k.to(DType::BF16), v); }, {"share a dtype", "bfloat16"});
  expect_refused([&] { (void)attention(q.to(DType::I64), k, v); }, {"q must be float64", "int64"});
  expect_refused(
      [&] {
        (void)attention(q, Tensor::zeros({2, 8, 3, 16}), Tensor::zeros({2, 8, 3, 16}));
      },
      {"must divide the query heads", "[2, 8, 3, 16]"});
  expect_refused(
      [&] {
        (void)attention(q, k, Tensor::zeros({2, 9, 2, 16}));
      },
      {"k and v must have the same [B, S, Hkv]"});
  expect_refused(
      [&] {
        (void)attention(q, Tensor::zeros({2, 8, 2, 8}), Tensor::zeros({2, 8, 2, 8}));
      },
      {"head dims", "[2, 8, 2, 8]"});
  expect_refused(
      [&] {
        (void)attention(q, Tensor::zeros({1, 8, 2, 16}), Tensor::zeros({1, 8, 2, 16}));
      },
      {"batch sizes"});
  expect_refused(
      [&] {
        (void)attention(Tensor::zeros({1, 2, 1, 300}), Tensor::zeros({1, 2, 1, 300}), Tensor::zeros({1, 2, 1, 300}));
      },
      {"head dim 300"});
  AttentionOptions nan_scale;
  nan_scale.softmax_scale = std::nan("");
  expect_refused([&] { (void)attention(q, k, v, nan_scale); }, {"softmax_scale"});
  expect_refused(
      [&] {
        (void)attention_backward(Tensor::zeros({2, 8, 4, 8}), q, k, v, q, Tensor::zeros({2, 4, 8}));
      },
      {"grad_out must match q"});
  expect_refused([&] { (void)attention_backward(q, q, k, v, q, Tensor::zeros({2, 4, 7})); }, {"lse must be"});
}

TEST(TeAttention, RegisteredInTheKernelRegistry) {
  // Registering the family in the process-wide registry first (as a layer-wide registration
  // would) leaves attention_ops() working.
  if (!ops::kernel_registry().has_kernel(kAttentionForwardOp, DeviceKind::CPU, DType::F32))
    register_attention_ops(ops::kernel_registry());
  (void)attention_ops();
  ops::KernelRegistry fresh;
  register_attention_ops(fresh);
  EXPECT_TRUE(fresh.has_kernel(kAttentionBackwardOp, DeviceKind::CPU, DType::BF16));
  const auto& r = ops::kernel_registry();
  for (DType t : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    EXPECT_TRUE(r.has_kernel(kAttentionForwardOp, DeviceKind::CPU, t));
    EXPECT_TRUE(r.has_kernel(kAttentionBackwardOp, DeviceKind::CPU, t));
#if KILN_WITH_CUDA
    EXPECT_TRUE(r.has_kernel(kAttentionForwardOp, DeviceKind::CUDA, t));
    EXPECT_TRUE(r.has_kernel(kAttentionBackwardOp, DeviceKind::CUDA, t));
#endif
  }
}

// ---- CUDA against the CPU -----------------------------------------------------------------------

bool have_cuda() { return device_count(DeviceKind::CUDA) > 0; }

using te_test::nmse;

void expect_cuda_matches_cpu(const Shape5& s, DType t, std::uint64_t seed, double tol) {
  Inputs in = make_inputs(s, seed);
  const Reference cpu = run_kiln(s, in, t, Device::cpu());
  const Reference gpu = run_kiln(s, in, t, Device::cuda(0));
  const std::string what = s.name() + " " + std::string(dtype_name(t));
  EXPECT_LE(nmse(gpu.out, cpu.out), tol) << what << ": output";
  EXPECT_LE(nmse(gpu.lse, cpu.lse), tol) << what << ": logsumexp";
  EXPECT_LE(nmse(gpu.dq, cpu.dq), tol) << what << ": grad q";
  EXPECT_LE(nmse(gpu.dk, cpu.dk), tol) << what << ": grad k";
  EXPECT_LE(nmse(gpu.dv, cpu.dv), tol) << what << ": grad v";
}

// bfloat16 and float16 at head dims 64 and 128 run the tensor-core kernels; the CPU accumulates in
// float too, so the two differ by the rounding of P and dS to 16 bits inside the GPU kernels.
TEST(TeAttentionCuda, TensorCoreKernelsMatchCpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const te_test::ScopedEnv kiln_kernels("KILN_ATTENTION_IMPL", "kiln");  // not cuDNN's
  const std::vector<Shape5> tc = {{2, 128, 128, 4, 4, 64, true}, {1, 200, 200, 8, 2, 128, true},
                                  {2, 77, 141, 4, 1, 64, true},  {1, 96, 96, 2, 2, 128, false},
                                  {1, 5, 3, 2, 1, 64, true},     {3, 257, 257, 6, 3, 64, true}};
  std::uint64_t seed = 700;
  for (DType t : {DType::BF16, DType::F16})
    for (const Shape5& s : tc) expect_cuda_matches_cpu(s, t, seed += 10, t == DType::BF16 ? 1e-4 : 1e-5);
}

// float64 and float32 (and 16-bit at other head dims) run the SIMT kernels.
TEST(TeAttentionCuda, SimtKernelsMatchCpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const te_test::ScopedEnv kiln_kernels("KILN_ATTENTION_IMPL", "kiln");  // not cuDNN's
  std::uint64_t seed = 900;
  for (const Shape5& s : shapes()) {
    expect_cuda_matches_cpu(s, DType::F64, seed += 10, 1e-24);
    expect_cuda_matches_cpu(s, DType::F32, seed += 10, 1e-10);
  }
  expect_cuda_matches_cpu({2, 33, 47, 4, 2, 40, true}, DType::BF16, seed += 10, 1e-4);
}

// The two CUDA paths against each other at bfloat16, head dim 64 and 128: the tensor-core kernels
// and the SIMT ones (forced with KILN_ATTENTION_SIMT=1).
TEST(TeAttentionCuda, TensorCoreAndSimtPathsAgree) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const te_test::ScopedEnv kiln_kernels("KILN_ATTENTION_IMPL", "kiln");  // not cuDNN's
  std::uint64_t seed = 1100;
  for (const Shape5& s : std::vector<Shape5>{{2, 150, 150, 4, 2, 64, true}, {1, 70, 190, 4, 4, 128, true}}) {
    const Inputs in = make_inputs(s, seed += 10);
    const Reference tc = run_kiln(s, in, DType::BF16, Device::cuda(0));
    ::setenv("KILN_ATTENTION_SIMT", "1", 1);
    const Reference simt = run_kiln(s, in, DType::BF16, Device::cuda(0));
    ::unsetenv("KILN_ATTENTION_SIMT");
    EXPECT_LE(nmse(tc.out, simt.out), 1e-4) << s.name();
    EXPECT_LE(nmse(tc.dq, simt.dq), 1e-4) << s.name();
    EXPECT_LE(nmse(tc.dk, simt.dk), 1e-4) << s.name();
    EXPECT_LE(nmse(tc.dv, simt.dv), 1e-4) << s.name();
  }
}

// The mma.sync forward (the default) against the CPU and the WMMA forward (KILN_ATTENTION_MMA=0).
TEST(TeAttentionCuda, MmaForwardMatchesCpuAndWmma) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const te_test::ScopedEnv kiln_kernels("KILN_ATTENTION_IMPL", "kiln");  // not cuDNN's
  std::uint64_t seed = 1300;
  for (DType t : {DType::BF16, DType::F16}) {
    for (const Shape5& s : std::vector<Shape5>{{2, 150, 150, 4, 2, 64, true},
                                               {1, 70, 190, 4, 4, 128, true},
                                               {1, 5, 3, 2, 1, 64, true},
                                               {2, 100, 80, 2, 1, 128, false}}) {
      const Inputs in = make_inputs(s, seed += 10);
      AttentionOptions o;
      o.causal = s.causal;
      NoGradGuard no_grad;
      const Device d = Device::cuda(0);
      const Tensor q = in.q.to(d, t), k = in.k.to(d, t), v = in.v.to(d, t);
      auto [mma_out, mma_lse] = attention_forward(q, k, v, o);  // the default Kiln forward
      ::setenv("KILN_ATTENTION_MMA", "0", 1);
      auto [wmma_out, wmma_lse] = attention_forward(q, k, v, o);
      ::unsetenv("KILN_ATTENTION_MMA");
      auto [cpu_out, cpu_lse] = attention_forward(in.q.to(t), in.k.to(t), in.v.to(t), o);
      const double tol = t == DType::BF16 ? 1e-4 : 1e-5;
      EXPECT_LE(nmse(mma_out.to_vector<double>(), cpu_out.to_vector<double>()), tol) << s.name();
      EXPECT_LE(nmse(mma_lse.to_vector<double>(), cpu_lse.to_vector<double>()), 1e-10) << s.name();
      EXPECT_LE(nmse(mma_out.to_vector<double>(), wmma_out.to_vector<double>()), tol) << s.name();
    }
  }
}

TEST(TeAttentionCuda, GradientsMatchFiniteDifferencesOnTheDevice) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const Shape5 s{2, 3, 7, 4, 2, 3, true};
  const Inputs in = make_inputs(s, 1234);
  auto f = [](const std::vector<Tensor>& x) { return attention(x[0], x[1], x[2]); };
  const Device d = Device::cuda(0);
  autograd::GradcheckResult g = autograd::gradcheck(f, {in.q.to(d), in.k.to(d), in.v.to(d)}, 1e-6, 1e-7, 1e-5);
  EXPECT_TRUE(g.ok) << g.message;
}

}  // namespace attention_test
}  // namespace kiln::te
