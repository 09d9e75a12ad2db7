#include "kiln/models/multi_token_prediction.h"

#include "kiln/autograd/functions.h"
#include "kiln/models/tensor_parallel_mappings.h"
#include "kiln/models/transformer_spec.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

Tensor shift_left(const Tensor& x) {
  KILN_CHECK(x.dim() == 2 && x.size(1) >= 1, "shift_left: expected [B, T], got {}", x.describe());
  const std::int64_t t = x.size(1);
  Tensor tail = Tensor::zeros({x.size(0), 1}, x.dtype(), x.device());
  return t == 1 ? tail : cat({x.narrow(1, 1, t - 1), tail}, 1);
}

Tensor add_mtp_gradient(const Tensor& main, const std::vector<Tensor>& depths, double scaling_factor) {
  KILN_CHECK(!depths.empty(), "MTP: no depth losses to add");
  Tensor sum = depths[0];
  for (std::size_t k = 1; k < depths.size(); ++k) sum = add(sum, depths[k]);
  const Tensor scaled = mul(sum, scaling_factor / static_cast<double>(depths.size()));
  return add(main, sub(scaled, scaled.detach()));
}

MultiTokenPredictionLayer::MultiTokenPredictionLayer(const GptConfig& config, std::int64_t layer_number,
                                                     Generator& seeds, const LayerContext& context)
    : Module("MultiTokenPredictionLayer"), context_(context) {
  const NormSpec norm = final_norm_spec(config);
  enorm = register_module("enorm", std::make_shared<TransformerNorm>(norm, context));
  hnorm = register_module("hnorm", std::make_shared<TransformerNorm>(norm, context));
  eh_proj = register_module("eh_proj", std::make_shared<ParallelLinear>(ParallelLinearKind::Column,
                                                                        2 * config.hidden_size, config.hidden_size,
                                                                        /*bias=*/false, context));
  eh_proj->gather_output = true;  // tensor parallelism: the whole [.., H] for the layer's residual stream
  transformer_layer = register_module(
      "transformer_layer", std::make_shared<TransformerLayer>(gpt_layer_spec(config), layer_number, seeds, context));
  final_layernorm = register_module("final_layernorm", std::make_shared<TransformerNorm>(norm, context));
}

Tensor MultiTokenPredictionLayer::forward(const Tensor& previous, const Tensor& embedded,
                                          const PositionContext& positions) {
  // Megatron's order: the embedding's half first, then the hidden state's.
  Tensor joined = cat({enorm->forward(embedded).first, hnorm->forward(previous).first}, 2);
  Tensor projected = eh_proj->forward(joined);  // under tensor parallelism gathered: [B, T, H] on every rank
  if (const dist::Communicator* tp = context_.tensor_parallel_group(); tp != nullptr && context_.sequence_parallel)
    projected = scatter_to_sequence_parallel_region(projected, *tp);  // back to this rank's slice
  return final_layernorm->forward(transformer_layer->forward(projected, positions)).first;
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
                                                      const MtpCrossEntropy& cross_entropy,
                                                      const PositionContext& positions,
                                                      const std::function<Tensor(const Tensor&)>& local) {
  const auto mine = [&local](const Tensor& x) { return local ? local(x) : x; };
  KILN_CHECK(
      hidden.dim() == 3 && tokens.dim() == 2 && hidden.size(0) == tokens.size(0) && labels.shape() == tokens.shape(),
      "MTP: expected hidden [B, T, H], tokens and labels [B, T], got {}, {} and {}", hidden.describe(),
      tokens.describe(), labels.describe());
  Tensor previous = hidden, shifted_tokens = tokens, shifted_labels = labels;
  Tensor mask =
      loss_mask.defined() ? loss_mask.to(DType::F32) : Tensor::ones(tokens.shape(), DType::F32, tokens.device());
  std::vector<Tensor> out;
  for (std::int64_t k = 0; k < num_layers(); ++k) {
    shifted_tokens = shift_left(shifted_tokens);  // t_{i+k}
    shifted_labels = shift_left(shifted_labels);  // t_{i+k+1}
    mask = shift_left(mask);
    previous = layers->at<MultiTokenPredictionLayer>(static_cast<std::size_t>(k))
                   ->forward(previous, embedding.forward(mine(shifted_tokens)), positions);
    out.push_back(cross_entropy(previous, mine(shifted_labels), mine(mask)));
  }
  return out;
}

}  // namespace kiln::models
