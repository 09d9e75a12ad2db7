#include "kiln/models/transformer_block.h"

#include <algorithm>

#include "kiln/autograd/checkpoint.h"
#include "kiln/models/moe_spec.h"
#include "kiln/models/transformer_spec.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

TransformerBlock::TransformerBlock(const GptConfig& config, Generator& seeds, const LayerContext& context)
    : Module("TransformerBlock"),
      recompute_{.granularity = config.recompute_granularity,
                 .method = config.recompute_method,
                 .num_layers = config.recompute_num_layers} {
  const TransformerLayerSpec spec = gpt_layer_spec(config);
  layers = register_module("layers", std::make_shared<nn::ModuleList>());
  // MoE: the layers config.is_moe_layer() names get a MoE MLP.
  TransformerLayerSpec moe_layer = spec;
  if (config.num_experts > 0) moe_layer.moe = std::make_shared<const MoeSpec>(moe_spec(config));
  // FP8: the layers is_fp8_layer() names get the recipe in their context.
  LayerContext fp8_context = context;
  fp8_context.fp8 = &config.fp8_recipe;
  for (std::int64_t i = 0; i < config.num_layers; ++i)
    layers->push_back(std::make_shared<TransformerLayer>(config.is_moe_layer(i) ? moe_layer : spec, i, seeds,
                                                         config.is_fp8_layer(i) ? fp8_context : context));
  final_layernorm =
      register_module("final_layernorm", std::make_shared<TransformerNorm>(final_norm_spec(config), context));
}

std::shared_ptr<TransformerLayer> TransformerBlock::layer(std::int64_t i) const {
  return layers->at<TransformerLayer>(static_cast<std::size_t>(i));
}

Tensor forward_layers(const std::vector<std::shared_ptr<TransformerLayer>>& layers, const Tensor& hidden_in,
                      const PositionContext& positions, const LayerRecompute& recompute) {
  const auto n = static_cast<std::int64_t>(layers.size());
  Tensor hidden = hidden_in;
  // Runs layers [begin, end) on x. A recomputed run outlives this call (the backward runs it again),
  // so it holds a copy of the positions and the layers, not references.
  auto run = [layers, positions](std::int64_t begin, std::int64_t end, Tensor x) {
    for (std::int64_t i = begin; i < end; ++i) x = layers[static_cast<std::size_t>(i)]->forward(x, positions);
    return x;
  };
  auto recomputed = [run](std::int64_t begin, std::int64_t end, const Tensor& x) {
    return autograd::checkpoint([run, begin, end](const std::vector<Tensor>& in) { return run(begin, end, in[0]); },
                                {x});
  };
  const bool on = recompute.granularity == RecomputeGranularity::Full && grad_enabled() && positions.cache == nullptr;
  if (!on) {
    hidden = run(0, n, hidden);
  } else if (recompute.method == RecomputeMethod::Uniform) {
    for (std::int64_t begin = 0; begin < n; begin += recompute.num_layers)
      hidden = recomputed(begin, std::min(n, begin + recompute.num_layers), hidden);
  } else {  // Block: the first recompute.num_layers layers each recomputed, the rest kept
    for (std::int64_t i = 0; i < n; ++i)
      hidden = i < recompute.num_layers ? recomputed(i, i + 1, hidden) : run(i, i + 1, hidden);
  }
  return hidden;
}

Tensor TransformerBlock::forward(const Tensor& hidden_in, const PositionContext& positions) {
  std::vector<std::shared_ptr<TransformerLayer>> all;
  for (std::int64_t i = 0; i < num_layers(); ++i) all.push_back(layer(i));
  return final_layernorm->forward(forward_layers(all, hidden_in, positions, recompute_)).first;
}

}  // namespace kiln::models
