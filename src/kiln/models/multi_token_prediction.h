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
//
// Tensor parallelism (Megatron's layout): the embedding and output layer are the model's vocabulary-
// parallel ones (the loss GptModel's vocabulary-parallel cross-entropy), eh_proj is column-parallel
// with its output gathered (then, under sequence parallelism, scattered back to this rank's slice of
// the sequence), and the transformer layer is a tensor-parallel layer like the decoder's.
#include <cstdint>
#include <functional>
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

 private:
  LayerContext context_;
};

// The mean cross-entropy of the output layer on hidden [B, T, H] (under sequence parallelism this
// rank's [B, T/tp, H]) against labels [B, T] over the positions whose mask [B, T] (f32) is 1.
using MtpCrossEntropy = std::function<Tensor(const Tensor& hidden, const Tensor& labels, const Tensor& mask)>;

class MultiTokenPredictionBlock : public nn::Module {
 public:
  // config.mtp_num_layers modules; their transformer layers are numbered after the decoder's.
  MultiTokenPredictionBlock(const GptConfig& config, Generator& seeds, const LayerContext& context);

  // The per-depth losses L_1 .. L_D (f32 scalars, differentiable). hidden: the main model's output
  // [B, T, H] ([B, T/tp, H] under sequence parallelism); tokens, labels [B, T] int64; loss_mask
  // [B, T] (undefined: all count); the output layer's loss `cross_entropy` (the model's).
  // Context parallelism: hidden is this rank's part of the sequences, tokens, labels and mask the
  // whole sequences (shifted whole: depth k's inputs at a chunk's end come from the next chunk), of
  // which `local` takes this rank's part (context_parallel_slice); empty: all of them.
  std::vector<Tensor> losses(const Tensor& hidden, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                             LanguageModelEmbedding& embedding, const MtpCrossEntropy& cross_entropy,
                             const PositionContext& positions,
                             const std::function<Tensor(const Tensor&)>& local = nullptr);

  std::int64_t num_layers() const { return static_cast<std::int64_t>(layers->size()); }
  std::shared_ptr<nn::ModuleList> layers;

 private:
  LayerContext context_;
};

// x [B, T] shifted left by one along T, `fill` (0) entering at the end: Megatron's roll_tensor.
Tensor shift_left(const Tensor& x);

// The model's loss with MTP (Megatron's MTPLossAutoScaler): `main` in value, and in its gradient
// also scaling_factor / D times the sum of the D depths' losses (x - x.detach() is 0 in value).
Tensor add_mtp_gradient(const Tensor& main, const std::vector<Tensor>& depths, double scaling_factor);

}  // namespace kiln::models
