#include "kiln/te/moe.h"

#include <algorithm>
#include <vector>

#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/linalg.h"
#include "kiln/te/grouped_gemm_path.h"

namespace kiln::te {

namespace {

void check_matrix(const Tensor& t, const char* what, const char* op) {
  KILN_CHECK(t.defined() && t.dim() == 2, "{}: {} must be a matrix, got {}", op, what,
             t.defined() ? t.describe() : "undefined");
}

// The experts' weight gradients added into the weight's fp32 main gradient (gradient-accumulation
// fusion, autograd/grad_accumulation_fusion.h): expert e's dy_e^T x_e into its [O, K] slice by one
// GEMM with beta 1, as the dense linears do; an expert without rows adds nothing. This saves the
// bf16 [E, O, K] gradient's write and the accumulation pass that reads it back (10 bytes a weight a
// micro-batch: for 8 Mixtral-sized experts a layer, 14 GB). On a GPU it runs only where the weight
// gradient is a loop of per-expert cuBLASLt GEMMs anyway (te/grouped_gemm_path.h: Loop, or Auto with
// every used expert at kAutoChunkedRows rows or more); with small experts one grouped launch in the
// weights' dtype plus the accumulation is faster than a GEMM per expert. Returns false, having done
// nothing, where it does not run.
bool add_expert_wgrads_into_main_grad(const Tensor& main_grad, const Tensor& dy, const Tensor& x,
                                      const Tensor& offsets) {
  const std::vector<std::int64_t> off = offsets.to(Device::cpu()).to_vector<std::int64_t>();
  if (x.device().is_cuda() && resolve_grouped_gemm_path(grouped_gemm_path(), off) != GroupedGemmPath::Loop)
    return false;
  const std::int64_t experts = main_grad.size(0), out = main_grad.size(1), in = main_grad.size(2);
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t lo = off[static_cast<std::size_t>(e)], n = off[static_cast<std::size_t>(e) + 1] - lo;
    if (n == 0) continue;
    const Tensor target =
        make_view(main_grad, {1, out, in}, {out * in, in, 1}, main_grad.storage_offset() + e * out * in);
    ops::gemm_into(dy.narrow(0, lo, n).view({1, n, out}), x.narrow(0, lo, n).view({1, n, in}), target,
                   /*trans_a=*/true, /*trans_b=*/false, 1.0, 1.0);
  }
  return true;
}

}  // namespace

RouterTopk router_topk(const Tensor& logits_in, const Tensor& expert_bias, const RouterTopkParams& p) {
  check_matrix(logits_in, "logits", "router_topk");
  const DType dt = logits_in.dtype();
  KILN_CHECK(dt == DType::F32 || (dt == DType::F64 && logits_in.device().is_cpu()),
             "router_topk: logits must be float32 (or float64 on the CPU), got {}", logits_in.describe());
  const std::int64_t n = logits_in.size(0), e = logits_in.size(1);
  KILN_CHECK(p.topk >= 1 && p.topk <= e, "router_topk: top-k {} must be in [1, {}] (the experts)", p.topk, e);
  if (p.num_groups > 0)
    KILN_CHECK(p.num_groups <= 64 && e % p.num_groups == 0 && p.group_topk >= 1 && p.group_topk <= p.num_groups &&
                   p.topk % p.group_topk == 0 && p.topk / p.group_topk <= e / p.num_groups,
               "router_topk: {} groups of {} experts with group top-k {} cannot give top-k {}", p.num_groups, e,
               p.group_topk, p.topk);
  KILN_CHECK(!expert_bias.defined() ||
                 (p.score == RouterScore::Sigmoid && expert_bias.numel() == e && expert_bias.dtype() == dt),
             "router_topk: an expert bias needs the sigmoid score and the logits' dtype, [{}], got {}", e,
             expert_bias.defined() ? expert_bias.describe() : "");
  const Tensor logits = ops::contiguous(logits_in);
  const Tensor bias = expert_bias.defined() ? ops::contiguous(expert_bias) : Tensor();
  RouterTopk out;
  out.probs = Tensor::empty({n, p.topk}, dt, logits.device());
  out.indices = Tensor::empty({n, p.topk}, DType::I64, logits.device());
  if (n > 0) ops::kernel(moe_ops().router_topk_forward, logits.device(), dt)(logits, bias, p, out.probs, out.indices);
  if (autograd::needs_grad({logits_in}))
    autograd::record("RouterTopkBackward", {logits_in}, {&out.probs},
                     [sl = autograd::SavedTensor(logits.detach()), si = autograd::SavedTensor(out.indices),
                      sp = autograd::SavedTensor(out.probs.detach()), p](const autograd::Grads& g) -> autograd::Grads {
                       if (!g[0].defined()) return {Tensor()};
                       const Tensor& l = sl.get("router_topk");
                       Tensor dl = Tensor::empty(l.shape(), l.dtype(), l.device());
                       if (l.size(0) > 0)
                         ops::kernel(moe_ops().router_topk_backward, l.device(), l.dtype())(
                             ops::contiguous(g[0].to(l.dtype())), l, si.get("router_topk"), sp.get("router_topk"), p,
                             dl);
                       return {dl};
                     });
  return out;
}

DispatchPlan dispatch_plan(const RouterTopk& routing, std::int64_t num_experts, std::int64_t capacity, bool pad,
                           TokenDropPolicy policy) {
  check_matrix(routing.indices, "indices", "dispatch_plan");
  KILN_CHECK(!pad || capacity > 0, "dispatch_plan: padding to capacity needs a capacity");
  DispatchPlan plan;
  plan.num_tokens = routing.indices.size(0);
  plan.topk = routing.indices.size(1);
  plan.num_experts = num_experts;
  const std::int64_t slots = plan.num_tokens * plan.topk;
  plan.rows = capacity <= 0 ? slots : pad ? num_experts * capacity : std::min(slots, num_experts * capacity);
  const Device d = routing.indices.device();
  plan.src_token = Tensor::empty({plan.rows}, DType::I64, d);
  plan.row_of = Tensor::empty({plan.num_tokens, plan.topk}, DType::I64, d);
  plan.offsets = Tensor::empty({num_experts + 1}, DType::I64, d);
  plan.tokens = Tensor::empty({num_experts}, DType::I64, d);
  plan.dropped = Tensor::empty({num_experts}, DType::I64, d);
  ops::kernel(moe_ops().dispatch_plan, d, DType::I64)(
      ops::contiguous(routing.indices), ops::contiguous(routing.probs.detach().to(DType::F32)), capacity, pad,
      policy == TokenDropPolicy::Position, plan.src_token, plan.row_of, plan.offsets, plan.tokens, plan.dropped);
  return plan;
}

namespace {

// [N, H] from rows [R, H] summed per token, weighted by probs (undefined: 1); no graph.
Tensor unpermute_raw(const Tensor& in, const DispatchPlan& plan, const Tensor& probs) {
  Tensor out = Tensor::empty({plan.num_tokens, in.size(1)}, in.dtype(), in.device());
  if (out.numel() > 0) ops::kernel(moe_ops().unpermute, in.device(), in.dtype())(in, plan.row_of, probs, out);
  return out;
}

Tensor permute_raw(const Tensor& x, const DispatchPlan& plan) {
  Tensor out = Tensor::empty({plan.rows, x.size(1)}, x.dtype(), x.device());
  if (out.numel() > 0) ops::kernel(moe_ops().permute, x.device(), x.dtype())(x, plan.src_token, out);
  return out;
}

}  // namespace

Tensor moe_permute(const Tensor& x_in, const DispatchPlan& plan) {
  check_matrix(x_in, "x", "moe_permute");
  KILN_CHECK(x_in.size(0) == plan.num_tokens, "moe_permute: x has {} tokens, the plan {}", x_in.size(0),
             plan.num_tokens);
  const Tensor x = ops::contiguous(x_in);
  Tensor y = permute_raw(x, plan);
  if (autograd::needs_grad({x_in}))
    autograd::record("MoePermuteBackward", {x_in}, {&y}, [plan](const autograd::Grads& g) -> autograd::Grads {
      if (!g[0].defined()) return {Tensor()};
      return {unpermute_raw(ops::contiguous(g[0]), plan, Tensor())};
    });
  return y;
}

Tensor moe_unpermute(const Tensor& in_arg, const DispatchPlan& plan, const Tensor& probs_arg) {
  check_matrix(in_arg, "in", "moe_unpermute");
  KILN_CHECK(in_arg.size(0) == plan.rows, "moe_unpermute: {} rows, the plan has {}", in_arg.size(0), plan.rows);
  const bool probs_dtype_ok =
      probs_arg.defined() &&
      (probs_arg.dtype() == DType::F32 || (probs_arg.dtype() == DType::F64 && in_arg.dtype() == DType::F64));
  KILN_CHECK(!probs_arg.defined() || (probs_dtype_ok && probs_arg.dim() == 2 && probs_arg.size(0) == plan.num_tokens &&
                                      probs_arg.size(1) == plan.topk),
             "moe_unpermute: probs must be float32 (or float64 with float64 rows) [{}, {}], got {}", plan.num_tokens,
             plan.topk, probs_arg.defined() ? probs_arg.describe() : "");
  const Tensor in = ops::contiguous(in_arg);
  const Tensor probs = probs_arg.defined() ? ops::contiguous(probs_arg) : Tensor();
  Tensor y = unpermute_raw(in, plan, probs);
  const bool probs_grad = probs_arg.defined() && probs_arg.requires_grad();
  if (autograd::needs_grad({in_arg, probs_arg}))
    autograd::record(
        "MoeUnpermuteBackward", {in_arg, probs_arg}, {&y},
        [plan, si = autograd::SavedTensor(in.detach()),
         sp = autograd::SavedTensor(probs.defined() ? probs.detach() : Tensor()),
         probs_grad](const autograd::Grads& g) -> autograd::Grads {
          if (!g[0].defined()) return {Tensor(), Tensor()};
          const Tensor& inv = si.get("moe_unpermute");
          const Tensor pv = sp.defined() ? sp.get("moe_unpermute") : Tensor();
          Tensor din = Tensor::empty(inv.shape(), inv.dtype(), inv.device());
          Tensor dprobs = probs_grad ? Tensor::empty({plan.num_tokens, plan.topk}, pv.dtype(), inv.device()) : Tensor();
          ops::kernel(moe_ops().unpermute_backward, inv.device(), inv.dtype())(ops::contiguous(g[0]), inv, plan.row_of,
                                                                               pv, din, dprobs);
          return {din, dprobs};
        });
  return y;
}

Tensor grouped_linear(const Tensor& x_in, const Tensor& w_in, const Tensor& offsets) {
  check_matrix(x_in, "x", "grouped_linear");
  KILN_CHECK(w_in.defined() && w_in.dim() == 3 && w_in.size(2) == x_in.size(1) && w_in.dtype() == x_in.dtype() &&
                 w_in.device() == x_in.device(),
             "grouped_linear: weight must be [E, O, {}] of x's dtype and device ({}), got {}", x_in.size(1),
             x_in.describe(), w_in.defined() ? w_in.describe() : "undefined");
  KILN_CHECK(offsets.dtype() == DType::I64 && offsets.numel() == w_in.size(0) + 1 && offsets.device() == x_in.device(),
             "grouped_linear: offsets must be int64 [{}] on {}, got {}", w_in.size(0) + 1, x_in.device().str(),
             offsets.describe());
  const Tensor x = ops::contiguous(x_in), w = ops::contiguous(w_in);
  Tensor y = Tensor::empty({x.size(0), w.size(1)}, x.dtype(), x.device());
  ops::kernel(moe_ops().grouped_gemm, x.device(), x.dtype())(x, w, offsets, false, y);
  if (autograd::needs_grad({x_in, w_in}))
    autograd::record("GroupedLinearBackward", {x_in, w_in}, {&y},
                     [sx = autograd::SavedTensor(x.detach()), sw = autograd::SavedTensor(w.detach()), offsets,
                      x_grad = x_in.requires_grad(), w_grad = w_in.requires_grad(),
                      w_leaf = w_in.requires_grad() && w_in.is_leaf() ? w_in : Tensor()](
                         const autograd::Grads& g) -> autograd::Grads {
                       if (!g[0].defined()) return {Tensor(), Tensor()};
                       const Tensor dy = ops::contiguous(g[0]);
                       const Tensor& xv = sx.get("grouped_linear");
                       const Tensor& wv = sw.get("grouped_linear");
                       Tensor dx, dw;
                       if (x_grad) {  // dx[r] = w[e]^T dy[r]: w read as [E, K, O] with O = dy's width
                         dx = Tensor::empty(xv.shape(), xv.dtype(), xv.device());
                         ops::kernel(moe_ops().grouped_gemm, xv.device(), xv.dtype())(dy, wv, offsets, true, dx);
                       }
                       if (w_grad) {
                         const Tensor main_grad = w_leaf.defined() ? autograd::fusable_main_grad(w_leaf) : Tensor();
                         if (main_grad.defined() && add_expert_wgrads_into_main_grad(main_grad, dy, xv, offsets)) {
                           autograd::note_main_grad_accumulated(w_leaf);
                         } else {
                           dw = Tensor::empty(wv.shape(), wv.dtype(), wv.device());
                           ops::kernel(moe_ops().grouped_gemm_wgrad, xv.device(), xv.dtype())(dy, xv, offsets, dw);
                         }
                       }
                       return {dx, dw};
                     });
  return y;
}

}  // namespace kiln::te
