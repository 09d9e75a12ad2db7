#pragma once
// MoELayer (Megatron-core's): the MLP of a MoE transformer layer.
//   routing = router(x)                         (TopKRouter: probs, experts, dispatch plan)
//   rows    = dispatcher.dispatch(x, routing)   (token order -> expert-major rows)
//   out     = dispatcher.combine(experts(rows), routing) + shared_experts(x)
// Parameter names (under decoder.layers.{i}.mlp.): router.weight [E, H], router.expert_bias [E]
// (a buffer, with --moe-router-enable-expert-bias), experts.weight1 / weight2 (moe_experts.h),
// shared_experts.linear_fc1 / linear_fc2 (an Mlp, with --moe-shared-expert-intermediate-size).
// Under tensor parallelism the router is whole and the shared expert tensor-parallel; with sequence
// parallelism x is [B, T/tp, H], this rank's slice, routed and dispatched by this rank alone. Under
// context parallelism x is this rank's part of the sequence (context_parallel_layout.h), routed
// alike, the router sharing its counts over the context-parallel group (with sequence parallelism,
// the tensor-and-context-parallel group). The experts are whole (expert tensor parallelism 1) or,
// with an expert-tensor-parallel group, a slice of each: the dispatched rows are then gathered over
// that group around the experts (expert_tensor_parallel_exchange.h):
//   out     = dispatcher.combine(exchange.scatter(experts(exchange.gather(rows))), routing) + ...
#include <memory>

#include "kiln/models/expert_tensor_parallel_exchange.h"
#include "kiln/models/moe_experts.h"
#include "kiln/models/moe_router.h"
#include "kiln/models/token_dispatcher.h"
#include "kiln/models/transformer_mlp.h"

namespace kiln::models {

class MoeLayer : public nn::Module {
 public:
  MoeLayer(const MoeSpec& spec, const LayerContext& context);
  Tensor forward(const Tensor& x);  // [..., T, H] (or [N, H]) -> the same shape

  MoeSpec spec;
  std::shared_ptr<TopKRouter> router;
  std::shared_ptr<GroupedMlp> experts;
  std::shared_ptr<Mlp> shared_experts;  // null without a shared expert

 private:
  std::unique_ptr<TokenDispatcher> dispatcher_;
  std::unique_ptr<ExpertTensorParallelExchange> exchange_;  // null with expert tensor parallelism 1
  bool sequence_parallel_ = false;  // the input is this tensor-parallel rank's slice of the sequence
};

}  // namespace kiln::models
