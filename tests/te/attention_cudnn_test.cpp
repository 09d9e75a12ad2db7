// te::attention through cuDNN's fused flash attention (te/cuda/attention_cudnn.h) against Kiln's
// CPU kernel at the same 16-bit dtype: output, logsumexp and dQ/dK/dV, causal (top-left and
// bottom-right aligned) and not, grouped-query and multi-query heads, head dims 64 and 128 (and
// 32, 96, 192 where cuDNN takes them),
// sequence lengths that are not multiples of 64, the plan cache, and how the implementation is
// chosen (AttentionOptions::impl, KILN_ATTENTION_IMPL). Skipped without a CUDA device; where cuDNN
// refuses the graph on the GPU at hand the test skips with cuDNN's reason, except on Hopper or newer
// where the basic shapes must build.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"
#include "kiln/te/attention.h"
#include "kiln/tensor/grad_mode.h"
#include "te_test_util.h"
#if KILN_WITH_CUDA
#include "kiln/te/cuda/attention_cudnn.h"
#endif

namespace kiln::te {
namespace attention_cudnn_test {

using te_test::nmse;
using te_test::ScopedEnv;

struct Case {
  std::int64_t B, T, S, Hq, Hkv, D;
  bool causal;
  double scale = 0;
  std::int64_t Dv = 0;  // the value head size; 0: D
  std::int64_t value_dim() const { return Dv > 0 ? Dv : D; }
  std::string name() const {
    return fmt::format("B{} T{} S{} Hq{} Hkv{} D{}{} {}{}", B, T, S, Hq, Hkv, D, Dv > 0 ? fmt::format(" Dv{}", Dv) : "",
                       causal ? "causal" : "full", scale != 0 ? fmt::format(" scale {}", scale) : "");
  }
};

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

// Forward (raw, for the lse) and forward + backward through the autograd record, at `t` on `d`.
[[maybe_unused]] Result run(const Case& c, DType t, Device d, AttentionImpl impl, std::uint64_t seed) {
  const Tensor q0 = Tensor::randn({c.B, c.T, c.Hq, c.D}, seed, DType::F64);
  const Tensor k0 = Tensor::randn({c.B, c.S, c.Hkv, c.D}, seed + 1, DType::F64);
  const Tensor v0 = Tensor::randn({c.B, c.S, c.Hkv, c.value_dim()}, seed + 2, DType::F64);
  const Tensor g0 = Tensor::randn({c.B, c.T, c.Hq, c.value_dim()}, seed + 3, DType::F64);
  AttentionOptions o;
  o.causal = c.causal;
  o.softmax_scale = c.scale;
  o.impl = impl;
  Tensor q = q0.to(d, t).detach().requires_grad_(true), k = k0.to(d, t).detach().requires_grad_(true),
         v = v0.to(d, t).detach().requires_grad_(true);
  Tensor out = attention(q, k, v, o);
  out.backward(g0.to(d, t));
  Result r;
  r.out = out.to_vector<double>();
  r.dq = q.grad().to_vector<double>();
  r.dk = k.grad().to_vector<double>();
  r.dv = v.grad().to_vector<double>();
  NoGradGuard no_grad;
  r.lse = attention_forward(q.detach(), k.detach(), v.detach(), o).second.to_vector<double>();
  return r;
}

[[maybe_unused]] void expect_close(const Result& got, const Result& want, double tol, const std::string& what) {
  EXPECT_LE(nmse(got.out, want.out), tol) << what << ": output";
  EXPECT_LE(nmse(got.lse, want.lse), 1e-8) << what << ": logsumexp";
  EXPECT_LE(nmse(got.dq, want.dq), tol) << what << ": grad q";
  EXPECT_LE(nmse(got.dk, want.dk), tol) << what << ": grad k";
  EXPECT_LE(nmse(got.dv, want.dv), tol) << what << ": grad v";
}

// The CUDA-vs-CPU bound of the TeAttentionCuda tests: both accumulate in float; the GPU rounds P and
// dS to 16 bits inside its kernels.
[[maybe_unused]] double tolerance(DType t) { return t == DType::BF16 ? 1e-4 : 1e-5; }

#if KILN_WITH_CUDA
bool hopper_or_newer() { return backend_for(Device::cuda(0)).properties(0).compute_major >= 9; }

// cuDNN's refusal of either direction of this case (building the plans), or empty.
std::string refusal(const Case& c, DType t, Device d) {
  AttentionParams p;
  p.batch = c.B, p.q_len = c.T, p.kv_len = c.S, p.q_heads = c.Hq, p.kv_heads = c.Hkv, p.head_dim = c.D;
  p.v_head_dim = c.Dv;
  p.causal = c.causal;
  p.scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
  const Tensor q = Tensor::zeros({c.B, c.T, c.Hq, c.D}, t, d);
  for (auto dir : {cuda::CudnnAttentionDirection::Forward, cuda::CudnnAttentionDirection::Backward})
    if (std::optional<std::string> r = cuda::cudnn_attention_prepare(dir, q, p)) return *r;
  return {};
}

#define KILN_REQUIRE_CUDNN_SDPA(cases, dtype, device, must_build)                                              \
  for (const Case& c_ : cases) {                                                                               \
    const std::string r_ = refusal(c_, dtype, device);                                                         \
    if (r_.empty()) continue;                                                                                  \
    if ((must_build) && hopper_or_newer()) FAIL() << "cuDNN refused a basic shape on Hopper or newer: " << r_; \
    GTEST_SKIP() << "cuDNN refuses the graph on this GPU: " << r_;                                             \
  }
#endif

TEST(TeAttentionCudnn, MatchesCpuKernel) {
  KILN_TE_REQUIRE_CUDA(d);
#if KILN_WITH_CUDA
  const std::vector<Case> cases = {
      {2, 128, 128, 4, 4, 64, true},    // multi-head, causal
      {1, 200, 200, 8, 2, 128, true},   // grouped-query, T not a multiple of 64
      {1, 96, 96, 2, 2, 128, false},    // non-causal
      {3, 100, 100, 6, 3, 64, false},   // grouped-query, non-causal
      {2, 65, 65, 4, 1, 64, true, 0.3}  // multi-query, the caller's scale
  };
  std::uint64_t seed = 4000;
  for (DType t : {DType::BF16, DType::F16}) {
    // Every new shape builds two plans (a second or so each when cuDNN compiles a kernel):
    // float16 runs the first two cases only.
    const std::vector<Case> run_cases = t == DType::BF16 ? cases : std::vector<Case>(cases.begin(), cases.begin() + 2);
    KILN_REQUIRE_CUDNN_SDPA(run_cases, t, d, true);
    for (const Case& c : run_cases) {
      const Result cpu = run(c, t, Device::cpu(), AttentionImpl::Kiln, seed);
      const Result gpu = run(c, t, d, AttentionImpl::Cudnn, seed);
      expect_close(gpu, cpu, tolerance(t), c.name() + " " + std::string(dtype_name(t)));
      seed += 10;
    }
  }
#else
  (void)d;  // a build without CUDA has no CUDA device: skipped above
#endif
}

#if KILN_WITH_CUDA
// Each case through cuDNN (forced) against Kiln's CPU kernel at bfloat16.
void expect_cudnn_matches_cpu(const std::vector<Case>& cases, Device d, std::uint64_t seed) {
  for (const Case& c : cases) {
    const Result cpu = run(c, DType::BF16, Device::cpu(), AttentionImpl::Kiln, seed);
    const Result gpu = run(c, DType::BF16, d, AttentionImpl::Cudnn, seed);
    expect_close(gpu, cpu, tolerance(DType::BF16), c.name());
    seed += 10;
  }
}
#endif

// Fewer queries than keys (a KV cache's last T positions): the causal diagonal aligned bottom-right,
// as Kiln's kernels align it.
TEST(TeAttentionCudnn, BottomRightCausalMatchesCpuKernel) {
  KILN_TE_REQUIRE_CUDA(d);
#if KILN_WITH_CUDA
  const std::vector<Case> cases = {{2, 77, 141, 4, 1, 64, true}, {1, 64, 192, 4, 2, 128, true}};
  KILN_REQUIRE_CUDNN_SDPA(cases, DType::BF16, d, false);
  expect_cudnn_matches_cpu(cases, d, 4200);
#else
  (void)d;  // a build without CUDA has no CUDA device: skipped above
#endif
}

// Head dims other than 64 and 128 that are multiples of 8 (cuDNN may refuse some on some GPUs).
TEST(TeAttentionCudnn, OtherHeadDimsMatchCpuKernel) {
  KILN_TE_REQUIRE_CUDA(d);
#if KILN_WITH_CUDA
  const std::vector<Case> cases = {{1, 70, 70, 4, 2, 32, true}, {1, 70, 70, 2, 2, 96, false}};
  KILN_REQUIRE_CUDNN_SDPA(cases, DType::BF16, d, false);
  expect_cudnn_matches_cpu(cases, d, 4300);
#else
  (void)d;  // a build without CUDA has no CUDA device: skipped above
#endif
}

// MLA's head dims (DeepSeek's 128 + 64 = 192 for q and k, 128 for v), which cuDNN takes on Hopper,
// forward and backward: one head size for all three (V padded, as MLA did before), and 192 / 128.
TEST(TeAttentionCudnn, MlaHeadDimMatchesCpuKernel) {
  KILN_TE_REQUIRE_CUDA(d);
#if KILN_WITH_CUDA
  const std::vector<Case> cases = {{1, 70, 70, 2, 2, 192, true}, {1, 70, 70, 4, 2, 192, true, 0, 128}};
  KILN_REQUIRE_CUDNN_SDPA(cases, DType::BF16, d, false);
  expect_cudnn_matches_cpu(cases, d, 4350);
#else
  (void)d;  // a build without CUDA has no CUDA device: skipped above
#endif
}

// The first call of a shape builds its plans; later calls (another scale included: it is a
// by-value scalar) reuse them; another shape builds its own.
TEST(TeAttentionCudnn, PlanCacheReused) {
  KILN_TE_REQUIRE_CUDA(d);
#if KILN_WITH_CUDA
  const Case c{1, 80, 80, 4, 2, 64, true};
  KILN_REQUIRE_CUDNN_SDPA(std::vector<Case>{c}, DType::BF16, d, true);
  (void)run(c, DType::BF16, d, AttentionImpl::Cudnn, 4400);
  const std::size_t built = cuda::cudnn_attention_plans_built();
  Case scaled = c;
  scaled.scale = 0.2;
  const Result a = run(scaled, DType::BF16, d, AttentionImpl::Cudnn, 4410);
  EXPECT_EQ(cuda::cudnn_attention_plans_built(), built) << "the same shape built a new plan";
  const Result cpu = run(scaled, DType::BF16, Device::cpu(), AttentionImpl::Kiln, 4410);
  expect_close(a, cpu, tolerance(DType::BF16), scaled.name() + " (cached plan, other scale)");
  Case other = c;
  other.T = other.S = 96;
  (void)run(other, DType::BF16, d, AttentionImpl::Cudnn, 4420);
  EXPECT_GT(cuda::cudnn_attention_plans_built(), built) << "a new shape reused another shape's plan";
#else
  (void)d;  // a build without CUDA has no CUDA device: skipped above
#endif
}

// Auto prefers cuDNN; KILN_ATTENTION_IMPL=kiln keeps a new shape away from cuDNN (no plan is
// built); both implementations agree.
TEST(TeAttentionCudnn, ImplSelection) {
  KILN_TE_REQUIRE_CUDA(d);
#if KILN_WITH_CUDA
  const Case c{2, 72, 72, 4, 4, 64, false};
  const std::size_t before = cuda::cudnn_attention_plans_built();
  Result kiln;
  {
    const ScopedEnv env("KILN_ATTENTION_IMPL", "kiln");
    kiln = run(c, DType::BF16, d, AttentionImpl::Auto, 4500);
  }
  EXPECT_EQ(cuda::cudnn_attention_plans_built(), before) << "KILN_ATTENTION_IMPL=kiln still built a cuDNN plan";
  KILN_REQUIRE_CUDNN_SDPA(std::vector<Case>{c}, DType::BF16, d, true);
  const Result autosel = run(c, DType::BF16, d, AttentionImpl::Auto, 4500);
  expect_close(autosel, kiln, tolerance(DType::BF16), c.name() + " auto (cuDNN) against Kiln's kernels");
#else
  (void)d;  // a build without CUDA has no CUDA device: skipped above
#endif
}

// GPT-2's attention reads q, k and v as views of one packed projection ([B, T, groups, (per group + 2)
// x D], Megatron's grouped layout): cuDNN reads them in place and writes dq, dk, dv as views of one
// packed gradient, which the split passes up. The packed projection's gradient equals the CPU
// kernel's (which works on contiguous copies); one query head per group (the views go to cuDNN as
// they are) and two (q is a copy, k and v stay views).
TEST(TeAttentionCudnn, PackedQkvViewsMatchCpuKernel) {
  KILN_TE_REQUIRE_CUDA(d);
#if KILN_WITH_CUDA
  struct Packed {
    std::int64_t B, T, groups, per_group, D;
  };
  std::uint64_t seed = 4600;
  for (const Packed& c : {Packed{2, 96, 4, 1, 64}, Packed{1, 80, 2, 2, 128}}) {
    const Case shape{c.B, c.T, c.T, c.groups * c.per_group, c.groups, c.D, true};
    KILN_REQUIRE_CUDNN_SDPA(std::vector<Case>{shape}, DType::BF16, d, true);
    const Tensor packed0 = Tensor::randn({c.B, c.T, c.groups, (c.per_group + 2) * c.D}, seed, DType::F64);
    const Tensor g0 = Tensor::randn({c.B, c.T, c.groups * c.per_group, c.D}, seed + 1, DType::F64);
    auto run_packed = [&](Device dev, AttentionImpl impl) {
      Tensor packed = packed0.to(dev, DType::BF16).detach().requires_grad_(true);
      std::vector<Tensor> parts = split_sizes(packed, {c.per_group * c.D, c.D, c.D}, 3);
      AttentionOptions o;
      o.impl = impl;
      Tensor out = attention(parts[0].reshape({c.B, c.T, c.groups * c.per_group, c.D}), parts[1], parts[2], o);
      out.backward(g0.to(dev, DType::BF16));
      return std::pair{out.to_vector<double>(), packed.grad().to_vector<double>()};
    };
    const auto [cpu_out, cpu_grad] = run_packed(Device::cpu(), AttentionImpl::Kiln);
    const auto [gpu_out, gpu_grad] = run_packed(d, AttentionImpl::Cudnn);
    const std::string what = fmt::format("groups {} x {} query heads, D {}", c.groups, c.per_group, c.D);
    EXPECT_LE(nmse(gpu_out, cpu_out), tolerance(DType::BF16)) << what << ": output";
    EXPECT_LE(nmse(gpu_grad, cpu_grad), tolerance(DType::BF16)) << what << ": grad of the packed projection";
    seed += 10;
  }
#else
  (void)d;  // a build without CUDA has no CUDA device: skipped above
#endif
}

#if KILN_WITH_CUDA
// Every tensor and operation descriptor of both graphs finalizes in cuDNN (this needs no GPU, so it
// runs on any machine with the library), with the operations cudnn-frontend's lowering has: the
// causal mask only when causal, its bottom-right shift only when T != S, the head reductions of
// dK and dV only for grouped-query heads, the dropout's generator and its multiplies only with
// dropout.
TEST(TeAttentionCudnn, GraphDescriptorsFinalize) {
  struct Variant {
    Case c;
    DType t;
    std::int64_t dv = 0;  // the value head size; 0: D
    double dropout = 0;
  };
  const std::vector<Variant> variants = {
      {{2, 128, 128, 4, 4, 64, true}, DType::BF16},         {{1, 77, 141, 8, 2, 128, true}, DType::F16},
      {{3, 100, 100, 6, 1, 96, false}, DType::BF16},        {{1, 70, 70, 2, 2, 192, true}, DType::BF16},
      {{1, 70, 70, 4, 2, 192, true}, DType::BF16, 128},  // MLA
      {{2, 128, 128, 4, 4, 64, true}, DType::BF16, 0, 0.1}, {{1, 96, 96, 8, 2, 128, false}, DType::F16, 0, 0.3}};
  for (const Variant& v : variants) {
    AttentionParams p;
    p.batch = v.c.B, p.q_len = v.c.T, p.kv_len = v.c.S, p.q_heads = v.c.Hq, p.kv_heads = v.c.Hkv;
    p.head_dim = v.c.D, p.v_head_dim = v.dv, p.causal = v.c.causal, p.scale = 0.125;
    p.dropout = v.dropout, p.dropout_seed = 5;
    const bool dropout = v.dropout > 0;
    const bool bottom_right = v.c.causal && v.c.T != v.c.S, grouped = v.c.Hq != v.c.Hkv;
    for (auto dir : {cuda::CudnnAttentionDirection::Forward, cuda::CudnnAttentionDirection::Backward}) {
      const bool bwd = dir == cuda::CudnnAttentionDirection::Backward;
      const std::string what = v.c.name() + (dropout ? " dropout" : "") + (bwd ? " backward" : " forward");
      std::string listing;
      ASSERT_NO_THROW(listing = cuda::cudnn_attention_describe(dir, v.t, p)) << what;
      auto has = [&](const std::string& op) { return listing.find(op) != std::string::npos; };
      EXPECT_EQ(has("binary_select"), v.c.causal) << what << "\n" << listing;
      EXPECT_EQ(has("row+skv-sq"), bottom_right) << what << "\n" << listing;
      EXPECT_TRUE(has(bwd ? "matmul_Q_KT" : "bmm1 Q.Kt")) << what << "\n" << listing;
      EXPECT_TRUE(has(bwd ? "identity_dQ" : "bmm2 P.V")) << what << "\n" << listing;
      if (bwd) {
        EXPECT_EQ(has("red_dK_head") && has("red_dV_head"), grouped) << what << "\n" << listing;
        EXPECT_EQ(has("dP_dropout_mask") && has("mul_p_dropout_mask") && has("dropout_scale_inv"), dropout)
            << what << "\n"
            << listing;
      } else {
        EXPECT_EQ(has("dropout_mask_mul"), dropout) << what << "\n" << listing;
      }
      EXPECT_EQ(has("rng rng (bernoulli, keep " + fmt::format("{}", 1.0 - v.dropout)), dropout) << what << "\n"
                                                                                                << listing;
      // forward: 2 matmuls, scale, 2 reductions, sub, exp, log, add, div; backward: 5 matmuls,
      // 3 reshapes, a reduction, 8 pointwise, the dQ conversion (+ the head reductions, the mask)
      const std::size_t ops = static_cast<std::size_t>(std::count(listing.begin(), listing.end(), '\n'));
      const std::size_t mask_ops = v.c.causal ? (bottom_right ? 6 : 4) : 0;
      const std::size_t base = bwd ? (18 + (grouped ? 2 : 0)) : 10;
      // dropout: the generator, and P's mask and scale (forward); the generator, P's mask and scale
      // for dV, dP's mask and dS's scale (backward)
      const std::size_t dropout_ops = dropout ? (bwd ? 5 : 3) : 0;
      EXPECT_EQ(ops, base + mask_ops + dropout_ops) << what << "\n" << listing;
    }
  }
}

// q, k and v as views of a packed [B, T, H, 3 x D] projection: the graphs take their strides.
TEST(TeAttentionCudnn, StridedGraphDescriptorsFinalize) {
  AttentionParams p;
  p.batch = 2, p.q_len = 128, p.kv_len = 128, p.q_heads = 4, p.kv_heads = 4, p.head_dim = 64, p.causal = true;
  p.scale = 0.125;
  const std::int64_t head = 3 * 64, token = 4 * head, batch = 128 * token;
  for (int i = 0; i < 3; ++i) p.q_stride[i] = p.kv_stride[i] = std::array<std::int64_t, 3>{batch, token, head}[i];
  for (auto dir : {cuda::CudnnAttentionDirection::Forward, cuda::CudnnAttentionDirection::Backward}) {
    std::string listing;
    ASSERT_NO_THROW(listing = cuda::cudnn_attention_describe(dir, DType::BF16, p));
    EXPECT_NE(listing.find(fmt::format("[{},{},{},1]", batch, head, token)), std::string::npos) << listing;
  }
}
#endif

// A forced cuDNN call that cuDNN cannot take is an error naming why; so is a bad KILN_ATTENTION_IMPL.
// (Runs without a GPU too: the CPU never runs cuDNN.)
TEST(TeAttentionCudnn, ForcedCudnnRefusalsAreErrors) {
  const Tensor q = Tensor::zeros({1, 8, 2, 16}), k = Tensor::zeros({1, 8, 2, 16}), v = Tensor::zeros({1, 8, 2, 16});
  AttentionOptions o;
  o.impl = AttentionImpl::Cudnn;
  te_test::expect_error([&] { (void)attention(q, k, v, o); }, {"te::attention", "cuDNN", "cpu"});
  {
    const ScopedEnv env("KILN_ATTENTION_IMPL", "flash");
    te_test::expect_error([&] { (void)attention(q, k, v); }, {"KILN_ATTENTION_IMPL", "flash"});
  }
  if (const auto d = te_test::cuda_device()) {
    te_test::expect_error([&] { (void)attention(q.to(*d), k.to(*d), v.to(*d), o); }, {"cuDNN", "float32"});
    const Tensor qb = Tensor::zeros({1, 8, 2, 16}, DType::BF16, *d);
    const Tensor kb = Tensor::zeros({1, 4, 2, 16}, DType::BF16, *d);
    te_test::expect_error([&] { (void)attention(qb, kb, kb, o); }, {"cuDNN", "more queries"});
  }
}

}  // namespace attention_cudnn_test
}  // namespace kiln::te
