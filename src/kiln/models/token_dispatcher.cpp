#include "kiln/models/token_dispatcher.h"

#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

namespace {

// An int64 index with every -1 replaced by `none` (the row of zeros appended to the source).
Tensor index_with_zero_row(const Tensor& index, std::int64_t none) {
  std::vector<std::int64_t> v = index.to(Device::cpu()).to_vector<std::int64_t>();
  for (auto& i : v)
    if (i < 0) i = none;
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(index.device());
}

Tensor with_zero_row(const Tensor& x) { return cat({x, Tensor::zeros({1, x.size(1)}, x.dtype(), x.device())}, 0); }

}  // namespace

DispatchedTokens LocalTokenDispatcher::dispatch(const Tensor& hidden, const RouterOutput& r) {
  DispatchedTokens out;
  out.offsets = r.plan.offsets;
  out.tokens = fused_ ? te::moe_permute(hidden, r.plan)
                      : index_select(with_zero_row(hidden), 0, index_with_zero_row(r.plan.src_token, hidden.size(0)));
  return out;
}

Tensor LocalTokenDispatcher::combine(const Tensor& expert_output, const RouterOutput& r) {
  const Tensor& probs = r.routing.probs;
  if (fused_) return te::moe_unpermute(expert_output, r.plan, probs);
  const std::int64_t n = r.plan.num_tokens, k = r.plan.topk, h = expert_output.size(1);
  const Tensor rows = index_select(with_zero_row(expert_output), 0,
                                   index_with_zero_row(r.plan.row_of.reshape({n * k}), expert_output.size(0)));
  const Tensor weights =
      (probs.dtype() == expert_output.dtype() ? probs : probs.to(expert_output.dtype())).reshape({n, k, 1});
  return sum(mul(rows.reshape({n, k, h}), weights), {1});
}

std::unique_ptr<TokenDispatcher> make_token_dispatcher(const MoeSpec& spec, const LayerContext& context) {
  const int ep = context.groups ? context.groups->ep().size() : 1;
  KILN_CHECK(ep == 1,
             "MoE: expert-parallel size {} has no token dispatcher yet (only the local one, expert-parallel size 1)",
             ep);
  return std::make_unique<LocalTokenDispatcher>(spec.permute_fusion);
}

}  // namespace kiln::models
