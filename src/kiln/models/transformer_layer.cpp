#include "kiln/models/transformer_layer.h"

#include "kiln/autograd/functions.h"

namespace kiln::models {

TransformerLayer::TransformerLayer(const TransformerLayerSpec& spec, std::int64_t layer_number, Generator& seeds,
                                   const LayerContext& context)
    : Module("TransformerLayer"), spec(spec) {
  input_layernorm =
      register_module("input_layernorm", std::make_shared<TransformerNorm>(spec.input_layernorm, context));
  if (spec.mla.enabled)  // MLA
    mla_self_attention = register_module(
        "self_attention",
        std::make_shared<MlaSelfAttention>(spec.self_attention, spec.mla, layer_number, seeds.next_seed(), context));
  else
    self_attention =
        register_module("self_attention",
                        std::make_shared<SelfAttention>(spec.self_attention, layer_number, seeds.next_seed(), context));
  pre_mlp_layernorm =
      register_module("pre_mlp_layernorm", std::make_shared<TransformerNorm>(spec.pre_mlp_layernorm, context));
  if (spec.moe)  // MoE
    moe = register_module("mlp", std::make_shared<MoeLayer>(*spec.moe, context));
  else
    mlp = register_module("mlp", std::make_shared<Mlp>(spec.mlp, context));
  // Under sequence parallelism the hidden dropouts act on each rank's slice of the sequence: each
  // rank draws its own masks (without it the ranks hold the same activations and share the mask).
  auto hidden_seed = [&] {
    const std::uint64_t seed = seeds.next_seed();
    return context.sequence_parallel && context.tensor_parallel_size() > 1
               ? tensor_parallel_dropout_seed(seed, context.tensor_parallel_rank())
               : seed;
  };
  self_attn_dropout =
      register_module("self_attn_dropout", std::make_shared<nn::Dropout>(spec.hidden_dropout, hidden_seed()));
  mlp_dropout = register_module("mlp_dropout", std::make_shared<nn::Dropout>(spec.hidden_dropout, hidden_seed()));
}

Tensor TransformerLayer::forward(const Tensor& hidden, const PositionContext& positions) {
  const Tensor normed_input = input_layernorm->forward(hidden).first;
  Tensor attention = mla_self_attention ? mla_self_attention->forward(normed_input, positions)  // MLA
                                        : self_attention->forward(normed_input, positions);
  // (pre_mlp_layernorm(hidden + dropout(attention)), hidden + dropout(attention))
  auto [normed, residual] = pre_mlp_layernorm->forward(self_attn_dropout->forward(attention), hidden);
  return add(mlp_dropout->forward(moe ? moe->forward(normed) : mlp->forward(normed)), residual);
}

}  // namespace kiln::models
