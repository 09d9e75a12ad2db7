#include "kiln/models/moe_layer.h"

#include "kiln/autograd/functions.h"

namespace kiln::models {

MoeLayer::MoeLayer(const MoeSpec& spec, const LayerContext& context)
    : Module("MoELayer"), spec(spec), dispatcher_(make_token_dispatcher(spec, context)) {
  // Sequence parallelism: each tensor-parallel rank holds its slice of the sequence and routes its
  // own tokens (Megatron-core with expert tensor parallelism 1: no copies of a token), the router
  // sharing its counts over the group (moe_router.h).
  sequence_parallel_ = context.sequence_parallel && context.tensor_parallel_size() > 1;
  // Context parallelism: each rank of the context-parallel group routes its part of the sequences
  // too, so the partition is that group, or the tensor-and-context-parallel one under sequence
  // parallelism (Megatron's tp_cp group).
  const int cp = context.context_parallel_size();
  const dist::Communicator* partition = cp > 1 ? (sequence_parallel_ ? &context.groups->tp_cp() : &context.groups->cp())
                                        : sequence_parallel_ ? context.tensor_parallel_group()
                                                             : nullptr;
  router = register_module("router", std::make_shared<TopKRouter>(spec, partition, cp));
  experts = register_module("experts", std::make_shared<GroupedMlp>(spec, context));
  if (context.expert_tensor_parallel_size() > 1)
    exchange_ = std::make_unique<ExpertTensorParallelExchange>(context.groups->expert_tp());
  if (spec.shared_expert_ffn > 0) {
    MlpSpec shared;
    shared.hidden_size = spec.hidden_size;
    shared.ffn_hidden_size = spec.shared_expert_ffn;
    shared.activation = spec.activation;
    shared.bias = false;  // MoE configs have --disable-bias-linear
    shared_experts = register_module("shared_experts", std::make_shared<Mlp>(shared, context));
  }
}

Tensor MoeLayer::forward(const Tensor& x) {
  const Shape shape = x.shape();
  const std::int64_t h = spec.hidden_size, n = x.numel() / h;
  const std::int64_t seq_length = x.dim() >= 3 ? x.size(x.dim() - 2) : n;
  const Tensor tokens = x.reshape({n, h});
  const RouterOutput routing = router->forward(tokens, seq_length);
  const DispatchedTokens rows = dispatcher_->dispatch(tokens, routing);
  Tensor expert_rows;
  if (exchange_) {
    const DispatchedTokens group_rows = exchange_->gather(rows);
    expert_rows = exchange_->scatter(experts->forward(group_rows.tokens, group_rows.offsets));
  } else {
    expert_rows = experts->forward(rows.tokens, rows.offsets);
  }
  Tensor out = dispatcher_->combine(expert_rows, routing);
  // The shared expert is a tensor-parallel MLP: under sequence parallelism it takes the [B, T/tp, H]
  // slice (its column-parallel fc1 gathers the sequence, its row-parallel fc2 reduce-scatters it).
  if (shared_experts)
    out = add(out, sequence_parallel_ ? shared_experts->forward(x).reshape({n, h}) : shared_experts->forward(tokens));
  return out.reshape(shape);
}

}  // namespace kiln::models
