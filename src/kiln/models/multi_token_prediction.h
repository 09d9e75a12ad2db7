#pragma once
// DeepSeek-V3's multi-token prediction (section 2.2; Megatron-core's MultiTokenPredictionBlock):
// D sequential modules after the main model, module k (1 .. D) predicting the token k + 1 ahead.
// With h^0 the main model's output (after its final_layernorm) and Emb / OutHead the model's own
// (shared) word embeddings and output layer, for position i:
//
//   h'^k_i = eh_proj([enorm(Emb(t_{i+k})); hnorm(h^{k-1}_i)])        (2H -> H, no bias; Megatron's order)
//   h^k    = final_layernorm(transformer_layer(h'^k))                  (one decoder layer of the model's spec)
//   L_k    = CE(OutHead(h^k_i), t_{i+k+1}) averaged over the positions whose label exists and counts
//
// The token and label sequences are shifted left by one per depth with zeros filled in at the end
// (those positions' loss mask is 0), as Megatron's roll_tensor. The loss of the model is
// L_main + mtp_loss_scaling_factor / D * sum_k L_k (GptModel::loss). Generation does not use MTP.
//
// Parameter names: mtp.layers.{k-1}.{enorm,hnorm,eh_proj,transformer_layer.*,final_layernorm}.
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/models/gpt_config.h"
#include "kiln/models/gpt_embedding.h"
#include "kiln/models/transformer_layer.h"
#include "kiln/nn/containers.h"
#include "kiln/tensor/random_generator.h"

namespace kiln::models {

class MultiTokenPredictionLayer : public nn::Module {
 public:
  MultiTokenPredictionLayer(const GptConfig& config, std::int64_t layer_number, Generator& seeds,
                            const LayerContext& context);
  // previous [B, T, H] (h^{k-1}), embedded [B, T, H] (Emb of the tokens shifted by k) -> h^k [B, T, H].
  Tensor forward(const Tensor& previous, const Tensor& embedded, const PositionContext& positions);

  std::shared_ptr<TransformerNorm> enorm, hnorm, final_layernorm;
  std::shared_ptr<ParallelLinear> eh_proj;
  std::shared_ptr<TransformerLayer> transformer_layer;
};

class MultiTokenPredictionBlock : public nn::Module {
 public:
  // config.mtp_num_layers modules; their transformer layers are numbered after the decoder's.
  MultiTokenPredictionBlock(const GptConfig& config, Generator& seeds, const LayerContext& context);

  // The per-depth losses L_1 .. L_D (f32 scalars, differentiable). hidden: the main model's output
  // [B, T, H]; tokens, labels [B, T] int64; loss_mask [B, T] (undefined: all count).
  std::vector<Tensor> losses(const Tensor& hidden, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                             LanguageModelEmbedding& embedding, const Tensor& output_weight,
                             const PositionContext& positions);

  std::int64_t num_layers() const { return static_cast<std::int64_t>(layers->size()); }
  std::shared_ptr<nn::ModuleList> layers;

 private:
  LayerContext context_;
};

// x [B, T] shifted left by one along T, `fill` (0) entering at the end: Megatron's roll_tensor.
Tensor shift_left(const Tensor& x);

}  // namespace kiln::models
