#include "kiln/models/moe_layer.h"

#include "kiln/autograd/functions.h"

namespace kiln::models {

MoeLayer::MoeLayer(const MoeSpec& spec, const LayerContext& context)
    : Module("MoELayer"), spec(spec), dispatcher_(make_token_dispatcher(spec, context)) {
  router = register_module("router", std::make_shared<TopKRouter>(spec));
  experts = register_module("experts", std::make_shared<GroupedMlp>(spec, context));
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
  Tensor out = dispatcher_->combine(experts->forward(rows.tokens, rows.offsets), routing);
  if (shared_experts) out = add(out, shared_experts->forward(tokens));
  return out.reshape(shape);
}

}  // namespace kiln::models
