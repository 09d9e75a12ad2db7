#pragma once
// The language model's loss on this rank's tokens, one definition for the whole model (GptModel)
// and a pipeline's last stage (GptPipelineStage):
//   output_layer_cross_entropy  the output layer's mean cross-entropy: the vocabulary-parallel one
//                               under tensor parallelism (vocab_parallel.h; the logits never exist
//                               whole), else CoreOps::linear_cross_entropy;
//   context_parallel_token_loss Megatron's loss under context parallelism: the mean over this rank's
//                               counted tokens rescaled to its share of the group's, times C, so that
//                               the gradients averaged over dp x cp are one process's;
//   context_parallel_rope       the rotations at this rank's positions (context_parallel_layout.h),
//                               rows of the whole table, read from position 0.
#include <cstdint>
#include <functional>

#include "kiln/dist/communicator.h"
#include "kiln/models/transformer_context.h"
#include "kiln/tensor/tensor.h"

namespace kiln::models {

// hidden [B, T, H] ([B, T/tp, H] under sequence parallelism), labels [B, T], loss_mask [B, T]
// (undefined: every token counts); `weight` the output layer's [V(/tp), H].
Tensor output_layer_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                                  const Tensor& loss_mask, const GptConfig& config, const LayerContext& context);

// `mean_loss(mask)` is the mean over the tokens `mask` counts (undefined: all) of this rank's
// part; labels and loss_mask that part's. Collective over `cp`.
Tensor context_parallel_token_loss(const std::function<Tensor(const Tensor& mask)>& mean_loss, const Tensor& labels,
                                   const Tensor& loss_mask, const dist::Communicator& cp);

// `whole`'s rows at rank `cp_rank`'s positions of a `seq`-token sequence, into `cached` (kept while
// it already holds them, on `whole`'s device); returns `cached`.
const RopeTable& context_parallel_rope(const RopeTable& whole, std::int64_t seq, int cp_size, int cp_rank,
                                       RopeTable& cached);

}  // namespace kiln::models
