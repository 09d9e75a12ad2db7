// Cases of te/'s mixture-of-experts family (te/moe_ops.h): the router's score + top-k (softmax
// after and before the top-k, sigmoid with expert bias and group-limited top-k, scaling factor),
// the dispatch plan with capacity dropping and padding, permute / unpermute, and the grouped GEMM
// with its weight gradient. The router serves f32 (and f64 on the CPU, the reference); the data
// kernels bf16/f16/f32 on CUDA. Logits come from distinct() so the top-k does not change under
// finite differences.
#include "harness.h"
#include "kiln/autograd/functions.h"
#include "kiln/te/moe.h"

namespace kiln::backend_ops {

namespace cases_te_moe {

Tensor router_dtype(const Tensor& t) { return t.dtype() == DType::F64 ? t : t.to(DType::F32); }

OpCase router_case(std::string name, te::RouterTopkParams p, std::int64_t experts, bool bias) {
  OpCase c;
  c.name = std::move(name);
  c.kernels = {te::kRouterTopkForwardOp, te::kRouterTopkBackwardOp};
  c.dtypes = {DType::F32};
  c.f64_on_every_backend = false;
  c.inputs = [experts, bias](bool large) {
    const std::int64_t n = large ? 16384 : 6;
    std::vector<Tensor> in{distinct({n, large ? 64 : experts}, 900, large ? 1e-4 : 0.05)};
    if (bias) in.push_back(randn({large ? 64 : experts}, 901, 0.05));
    return in;
  };
  c.forward = [p, bias](const std::vector<Tensor>& in) {
    const te::RouterTopk r = te::router_topk(router_dtype(in[0]), bias ? router_dtype(in[1]) : Tensor(), p);
    return std::vector<Tensor>{r.probs, r.indices};
  };
  c.grad_inputs = {0};
  return c;
}

// Token n routes to experts (3n + j * 5) mod E, j < k: distinct for k <= 2 with E = 4 or 8.
te::RouterTopk fixed_routing(const Tensor& probs, std::int64_t experts) {
  const std::int64_t n = probs.size(0), k = probs.size(1);
  std::vector<std::int64_t> idx(static_cast<std::size_t>(n * k));
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t j = 0; j < k; ++j) idx[static_cast<std::size_t>(t * k + j)] = (3 * t + j * 5) % experts;
  return {probs, Tensor::from_vector(idx, {n, k}).to(probs.device())};
}

OpCase permute_case(std::string name, std::int64_t capacity, bool pad, te::TokenDropPolicy policy) {
  OpCase c;
  c.name = std::move(name);
  c.kernels = {te::kMoeDispatchPlanOp, te::kMoePermuteOp, te::kMoeUnpermuteOp, te::kMoeUnpermuteBackwardOp};
  c.dtypes = {DType::F32, DType::BF16};
  c.f64_on_every_backend = false;
  c.inputs = [](bool large) {
    const std::int64_t n = large ? 16384 : 10, h = large ? 4096 : 6;
    // Probabilities 0.04 apart (a bf16 run keeps their order, so its plan is the reference's).
    return std::vector<Tensor>{randn({n, h}, 910), add(distinct({n, 2}, 911, large ? 1e-5 : 0.04), 1.0)};
  };
  c.forward = [capacity, pad, policy](const std::vector<Tensor>& in) {
    const Tensor probs = in[1].dtype() == DType::F64 ? in[1] : in[1].to(DType::F32);
    const std::int64_t experts = in[0].size(0) > 1000 ? 8 : 4;
    const te::DispatchPlan plan = te::dispatch_plan(fixed_routing(probs, experts), experts, capacity, pad, policy);
    const Tensor rows = te::moe_permute(in[0], plan);
    // out = unpermute(rows * 1.5) weighted by probs: both kernels and the plan in one function.
    const Tensor out = te::moe_unpermute(mul(rows, 1.5), plan, probs);
    return std::vector<Tensor>{out, rows, plan.row_of, plan.src_token, plan.offsets, plan.tokens, plan.dropped};
  };
  c.grad_inputs = {0, 1};
  return c;
}

}  // namespace cases_te_moe

void add_te_moe_cases(std::vector<OpCase>& cases) {
  using namespace cases_te_moe;  // this file's helpers (a named namespace: the tests compile in unity batches)
  te::RouterTopkParams post;
  post.topk = 2;
  cases.push_back(router_case("te/moe_router_topk/softmax", post, 5, false));
  te::RouterTopkParams pre = post;
  pre.pre_softmax = true;
  pre.scaling_factor = 2.5;
  cases.push_back(router_case("te/moe_router_topk/pre_softmax_scaled", pre, 5, false));
  te::RouterTopkParams sig;
  sig.score = te::RouterScore::Sigmoid;
  sig.topk = 4;
  sig.num_groups = 4;
  sig.group_topk = 2;
  cases.push_back(router_case("te/moe_router_topk/sigmoid_bias_groups", sig, 8, true));
  te::RouterTopkParams sig1 = sig;
  sig1.topk = 1;
  sig1.num_groups = 0;
  sig1.group_topk = 0;
  cases.push_back(router_case("te/moe_router_topk/sigmoid_top1", sig1, 8, false));

  cases.push_back(permute_case("te/moe_permute/no_capacity", 0, false, te::TokenDropPolicy::Probs));
  cases.push_back(permute_case("te/moe_permute/drop_probs", 4, false, te::TokenDropPolicy::Probs));
  cases.push_back(permute_case("te/moe_permute/drop_position_padded", 4, true, te::TokenDropPolicy::Position));

  OpCase g;
  g.name = "te/grouped_gemm";
  g.kernels = {te::kGroupedGemmOp, te::kGroupedGemmWgradOp};
  g.dtypes = {DType::F32, DType::BF16};
  g.f64_on_every_backend = false;
  g.inputs = [](bool large) {
    if (large) return std::vector<Tensor>{randn({16384, 1024}, 920, 0.5), randn({8, 2048, 1024}, 921, 0.05)};
    return std::vector<Tensor>{randn({13, 7}, 920), randn({4, 5, 7}, 921, 0.5)};
  };
  g.forward = [](const std::vector<Tensor>& in) {
    const std::int64_t rows = in[0].size(0), e = in[1].size(0);
    // Uneven groups, one empty, and unused rows at the end (zeros).
    std::vector<std::int64_t> off = {0, 3, 3, 8, 11};
    if (rows > 1000) {
      off.assign(static_cast<std::size_t>(e + 1), 0);
      for (std::int64_t i = 1; i <= e; ++i) off[static_cast<std::size_t>(i)] = rows * i / e;
    }
    const Tensor offsets = Tensor::from_vector(off, {e + 1}).to(in[0].device());
    return std::vector<Tensor>{te::grouped_linear(in[0], in[1], offsets)};
  };
  g.grad_inputs = {0, 1};
  cases.push_back(g);

  // Shapes that reach the edges of every CUDA path (te/cuda/grouped_gemm_cublas.h; which one runs
  // is KILN_GROUPED_GEMM's choice, grouped by default): an expert of 130 rows, an empty expert,
  // unused tail rows, K = 72 and O = 136, all operand pointers 16-byte aligned so that the cuBLAS
  // grouped call takes them (experts 0 and 2 form one group of two). Under KILN_GROUPED_GEMM=tc,
  // bf16 / f16 take the tensor-core kernels (te/cuda/grouped_gemm_tc.cu: 128 x 128 tiles, k steps
  // of 32; a full and a 2-row tile, a partial k step, a partial column tile, a weight gradient over
  // 130 rows) and f32 the SIMT kernel. Its gradients are the small case's function, checked there by
  // finite differences.
  OpCase tc;
  tc.name = "te/grouped_gemm/tensor_core";
  tc.kernels = {te::kGroupedGemmOp, te::kGroupedGemmWgradOp};
  tc.dtypes = {DType::F32, DType::BF16, DType::F16};
  tc.f64_on_every_backend = false;
  tc.finite_differences = false;
  tc.inputs = [](bool large) {
    if (large) return std::vector<Tensor>{randn({16384, 2048}, 922, 0.5), randn({8, 1024, 2048}, 923, 0.05)};
    return std::vector<Tensor>{randn({300, 72}, 922, 0.5), randn({4, 136, 72}, 923, 0.2)};
  };
  tc.forward = [](const std::vector<Tensor>& in) {
    const std::int64_t rows = in[0].size(0), e = in[1].size(0);
    std::vector<std::int64_t> off = {0, 130, 130, 260, 290};
    if (rows > 1000) {  // perf: top-2 of 8 experts over 8192 tokens, unevenly loaded
      const std::vector<std::int64_t> load = {2600, 1400, 2300, 1800, 2100, 1900, 2200, 2084};
      off.assign(1, 0);
      for (std::int64_t n : load) off.push_back(off.back() + n);
    }
    const Tensor offsets = Tensor::from_vector(off, {e + 1}).to(in[0].device());
    return std::vector<Tensor>{te::grouped_linear(in[0], in[1], offsets)};
  };
  tc.grad_inputs = {0, 1};
  cases.push_back(tc);
}

}  // namespace kiln::backend_ops
