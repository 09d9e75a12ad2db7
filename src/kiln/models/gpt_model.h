#pragma once
// GptModel: a GPT-2 or Llama style decoder (Megatron-core's GPTModel): embedding -> decoder
// (TransformerBlock) -> output layer, tied to the word embeddings unless
// untie_embeddings_and_output_weights. How it is built comes from the GptConfig (gpt_layer_spec),
// how it computes from config.transformer_impl (CoreOps), where it runs from the process groups.
//
// Parameter names are Megatron-core's, so checkpoints map 1:1 onto Megatron's:
//   embedding.word_embeddings.weight [Vpad, H]; embedding.position_embeddings.weight [P, H] (learned)
//   decoder.layers.{i}.input_layernorm.{weight,bias}
//   decoder.layers.{i}.self_attention.linear_qkv.{weight,bias}   [(nh + 2 ng) kv, H], grouped per query group
//   decoder.layers.{i}.self_attention.linear_proj.{weight,bias}  [H, nh kv]
//   decoder.layers.{i}.pre_mlp_layernorm.{weight,bias}
//   decoder.layers.{i}.mlp.linear_fc1.{weight,bias}              [F or 2F (gate | up), H]
//   decoder.layers.{i}.mlp.linear_fc2.{weight,bias}              [H, F]
//   decoder.final_layernorm.{weight,bias};  output_layer.weight [Vpad, H] (untied only)
// MLA (transformer_mla.h): decoder.layers.{i}.self_attention.{linear_q_proj | linear_q_down_proj,
//   q_layernorm, linear_q_up_proj}, .linear_kv_down_proj, .kv_layernorm, .linear_kv_up_proj, .linear_proj
// MTP (multi_token_prediction.h): mtp.layers.{k}.{enorm, hnorm, eh_proj, transformer_layer.*, final_layernorm}
// (biases only with add_bias_linear; norm biases only with LayerNorm.)
//
// Parameters are f32 on the CPU after construction; move them with to(device) / to(DType::BF16).
// The loss is always taken in f32.
//
// Tensor parallelism (groups->tp() of config.tensor_model_parallel_size ranks, docs/parallel.md):
// each rank holds its heads and query groups (linear_qkv column-parallel, linear_proj row-parallel),
// its F / tp MLP units (linear_fc1 column-parallel, SwiGLU's halves alike; linear_fc2 row-parallel),
// its rows of the padded vocabulary in the word embeddings and output layer; the loss is the
// vocabulary-parallel cross-entropy. With config.sequence_parallel the hidden states between them
// are [B, T/tp, H]. The state_dict holds each rank's shards; tensor_parallel_layout() says how to
// gather them into the whole tensors (the names and whole shapes above) and to slice them again.
//
// Context parallelism (groups->cp() of config.context_parallel_size ranks): loss() and forward()
// take the whole sequence [B, T] on every rank of the group and keep the rank's load-balanced part
// (context_parallel_layout.h: chunks r and 2C - 1 - r of 2C), [B, T/C], at its true positions
// (learned position embeddings and RoPE); self-attention spans the group
// (context_parallel_attention.h), everything else is token-local. The parameters are whole on every
// rank.
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/models/gpt_config.h"
#include "kiln/models/gpt_embedding.h"
#include "kiln/models/gpt_kv_cache.h"
#include "kiln/models/multi_token_prediction.h"
#include "kiln/models/tensor_parallel_layout.h"
#include "kiln/models/transformer_block.h"

namespace kiln::models {

class GptModel : public nn::Module {
 public:
  // Validates the config and initialises as Megatron (N(0, std); linear_proj and linear_fc2 with
  // std / sqrt(2 * num_layers); biases 0; norms 1 and 0), from a generator seeded with `seed` (the
  // dropout modules' seeds too), so equal seeds give equal models on every device.
  // `groups`: the process groups the layers are distributed over (null: this process alone).
  GptModel(GptConfig config, std::uint64_t seed, const dist::ProcessGroups* groups = nullptr);

  const GptConfig& config() const { return config_; }

  // tokens [B, T] int64 -> logits [B, T, padded_vocab] (the parameters' dtype), positions 0 .. T.
  // Context parallelism: the logits of this rank's part of the sequence, [B, T/C, padded_vocab].
  Tensor forward(const Tensor& tokens);
  // The next tokens at positions cache.length() ..: stores their keys and values in the cache,
  // advances it by T and returns their logits. Runs without recording gradients; call eval() first
  // (in training mode dropout applies here too).
  Tensor forward(const Tensor& tokens, KvCache& cache);
  // Scalar f32 sum(CE * mask) / sum(mask) over labels [B, T] int64 with loss_mask [B, T] (any
  // floating dtype; undefined: every token counts), through CoreOps::linear_cross_entropy. A mask
  // of zeros gives NaN (0 / 0), as Megatron's.
  // Context parallelism: this rank's masked sum over its tokens divided by the group's mask sum, times
  // the group's size (Megatron's loss under CP), so that the mean of the group's losses and of their
  // gradients is the one-process loss and gradient.
  // MTP: with MTP layers and gradients on, the returned value is still the main loss, but its
  // gradient is that of L_main + mtp_loss_scaling_factor / D * sum_k L_k (Megatron's
  // MTPLossAutoScaler), and the per-depth L_k are kept for mtp_losses().
  Tensor loss(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask);
  // MTP: the per-depth losses L_1 .. L_D of the last loss() call with gradients on (detached f32
  // scalars on the model's device); empty without MTP.
  const std::vector<Tensor>& mtp_losses() const { return mtp_losses_; }
  // The decoder's output after final_layernorm, [B, T, H], before the output layer (positions {}:
  // a plain forward from position 0; the RoPE table is filled in). Context parallelism: `tokens` is
  // this rank's part of the sequence (context_parallel_slice), at its true positions.
  Tensor hidden_states(const Tensor& tokens, const PositionContext& positions);

  KvCache make_kv_cache(std::int64_t batch, std::int64_t max_tokens) const;

  // The output layer's weight: output_layer.weight when untied, else the word embeddings.
  const Tensor& output_weight() const;
  // The model's dropout modules (their seeds and offsets are the model's random state, to
  // checkpoint for a bit-identical resume).
  std::vector<std::shared_ptr<nn::Dropout>> dropout_modules() const;
  // Megatron's init again, from a generator seeded with `seed` (what the constructor does).
  void reset_parameters(std::uint64_t seed);
  // Tensor parallelism: dropout inside the tensor-parallel region (attention) and, under sequence
  // parallelism, on the sequence slices draws its own masks on each rank (its seed mixed with the
  // rank, tensor_parallel_dropout_seed). A checkpoint records rank 0's streams; after loading them
  // on every rank, this gives rank r its own again (rank 0's stay): call it after restoring a
  // checkpoint's random state. Nothing to do without tensor parallelism.
  void reseed_tensor_parallel_dropout();
  // Tensor parallelism: how each parameter lies over the tensor-parallel group (empty without one):
  // what checkpoints gather and slice, and what the gradient norm and sequence parallelism need.
  TensorParallelLayout tensor_parallel_layout() const;
  // Expert parallelism: the MoE layers' routed experts (mlp.experts.weight1 / weight2), split along
  // dimension 0 (the experts) over the expert-parallel group; empty when the experts are whole on
  // every rank (expert-parallel and expert-tensor-parallel sizes 1).
  TensorParallelLayout expert_parallel_layout() const;
  // Expert tensor parallelism: of each of a rank's experts its slice of F over the
  // expert-tensor-parallel group (weight1 by rows, SwiGLU's gate and up blocks alike; weight2 by
  // columns); empty when that group has one rank. A rank's shard is this split of its
  // expert-parallel block.
  TensorParallelLayout expert_tensor_parallel_layout() const;

  std::shared_ptr<LanguageModelEmbedding> embedding;
  std::shared_ptr<TransformerBlock> decoder;
  std::shared_ptr<ParallelLinear> output_layer;    // column-parallel, no bias; null when tied
  std::shared_ptr<MultiTokenPredictionBlock> mtp;  // MTP: null without --mtp-num-layers

 private:
  const RopeTable* rope_table(Device device, std::int64_t positions);
  // The output layer's loss of this rank's tokens, the main loss's and each MTP depth's: their
  // cross_entropy(), under context parallelism rescaled to this rank's share of the group's, times C.
  Tensor token_loss(const Tensor& hidden, const Tensor& labels, const Tensor& loss_mask);
  // The output layer's mean cross-entropy of hidden [B, T (T/tp under sequence parallelism), H] against
  // labels [B, T] where loss_mask [B, T] (undefined: everywhere) counts; vocabulary-parallel under
  // tensor parallelism.
  Tensor cross_entropy(const Tensor& hidden, const Tensor& labels, const Tensor& loss_mask);
  // hidden [B, T (or T/tp under sequence parallelism), H] -> whole logits [B, T, Vpad].
  Tensor output_logits(const Tensor& hidden);

  GptConfig config_;
  LayerContext context_;
  RopeTable rope_;                   // made on first use on the parameters' device
  RopeTable context_parallel_rope_;  // context parallelism: rope_'s rows at this rank's positions
  std::vector<Tensor> mtp_losses_;   // MTP
};

// What GptModel's two functions above do over any module holding its layers (a pipeline stage):
// the splits of its ParallelLinears and norms (not the word embeddings'), and rank `rank`'s own
// dropout streams from rank 0's.
TensorParallelLayout tensor_parallel_layout_of(const nn::Module& model, bool sequence_parallel);
void reseed_tensor_parallel_dropout_of(const nn::Module& model, int tp, int rank, bool sequence_parallel);

}  // namespace kiln::models
