#include "kiln/models/multi_token_prediction.h"

#include "kiln/autograd/functions.h"
#include "kiln/models/transformer_spec.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

Tensor shift_left(const Tensor& x) {
  KILN_CHECK(x.dim() == 2 && x.size(1) >= 1, "shift_left: expected [B, T], got {}", x.describe());
  const std::int64_t t = x.size(1);
  Tensor tail = Tensor::zeros({x.size(0), 1}, x.dtype(), x.device());
  return t == 1 ? tail : cat({x.narrow(1, 1, t - 1), tail}, 1);
}

MultiTokenPredictionLayer::MultiTokenPredictionLayer(const GptConfig& config, std::int64_t layer_number,
                                                     Generator& seeds, const LayerContext& context)
    : Module("MultiTokenPredictionLayer") {
  const NormSpec norm = final_norm_spec(config);
  enorm = register_module("enorm", std::make_shared<TransformerNorm>(norm, context));
  hnorm = register_module("hnorm", std::make_shared<TransformerNorm>(norm, context));
  eh_proj = register_module("eh_proj", std::make_shared<ParallelLinear>(ParallelLinearKind::Column,
                                                                        2 * config.hidden_size, config.hidden_size,
                                                                        /*bias=*/false, context));
  transformer_layer = register_module(
      "transformer_layer", std::make_shared<TransformerLayer>(gpt_layer_spec(config), layer_number, seeds, context));
  final_layernorm = register_module("final_layernorm", std::make_shared<TransformerNorm>(norm, context));
}

Tensor MultiTokenPredictionLayer::forward(const Tensor& previous, const Tensor& embedded,
                                          const PositionContext& positions) {
  // Megatron's order: the embedding's half first, then the hidden state's.
  Tensor joined = cat({enorm->forward(embedded).first, hnorm->forward(previous).first}, 2);
  return final_layernorm->forward(transformer_layer->forward(eh_proj->forward(joined), positions)).first;
}

MultiTokenPredictionBlock::MultiTokenPredictionBlock(const GptConfig& config, Generator& seeds,
                                                     const LayerContext& context)
    : Module("MultiTokenPredictionBlock"), context_(context) {
  layers = register_module("layers", std::make_shared<nn::ModuleList>());
  for (std::int64_t k = 0; k < config.mtp_num_layers; ++k)
    layers->push_back(std::make_shared<MultiTokenPredictionLayer>(config, config.num_layers + k, seeds, context));
}

std::vector<Tensor> MultiTokenPredictionBlock::losses(const Tensor& hidden, const Tensor& tokens, const Tensor& labels,
                                                      const Tensor& loss_mask, LanguageModelEmbedding& embedding,
                                                      const Tensor& output_weight, const PositionContext& positions) {
  KILN_CHECK(hidden.dim() == 3 && tokens.dim() == 2 && hidden.size(0) == tokens.size(0) &&
                 hidden.size(1) == tokens.size(1) && labels.shape() == tokens.shape(),
             "MTP: expected hidden [B, T, H], tokens and labels [B, T], got {}, {} and {}", hidden.describe(),
             tokens.describe(), labels.describe());
  const std::int64_t n = tokens.numel(), h = hidden.size(2);
  Tensor previous = hidden, shifted_tokens = tokens, shifted_labels = labels;
  Tensor mask =
      loss_mask.defined() ? loss_mask.to(DType::F32) : Tensor::ones(tokens.shape(), DType::F32, tokens.device());
  std::vector<Tensor> out;
  for (std::int64_t k = 0; k < num_layers(); ++k) {
    shifted_tokens = shift_left(shifted_tokens);  // t_{i+k}
    shifted_labels = shift_left(shifted_labels);  // t_{i+k+1}
    mask = shift_left(mask);
    previous = layers->at<MultiTokenPredictionLayer>(static_cast<std::size_t>(k))
                   ->forward(previous, embedding.forward(shifted_tokens), positions);
    out.push_back(context_.ops->linear_cross_entropy(previous.reshape({n, h}), output_weight,
                                                     shifted_labels.reshape({n}), mask.reshape({n})));
  }
  return out;
}

}  // namespace kiln::models
