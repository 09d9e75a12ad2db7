#pragma once
// `kiln pretrain-gpt` below the CLI: a models::GptModel from its config, checked to fit in the
// device's memory before anything is allocated, trained by train_language_model (gpt_trainer.h).
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/models/gpt_config.h"
#include "kiln/train/gpt_trainer.h"

namespace kiln::train {

// Bytes a training run holds on its device, by what holds them.
struct TrainingMemoryEstimate {
  std::size_t parameters = 0;   // the model's weights in their training dtype
  std::size_t gradients = 0;    // the fp32 gradient buffers
  std::size_t optimizer = 0;    // Adam's two fp32 moments, plus fp32 masters of bf16 weights
  std::size_t activations = 0;  // what one micro-batch's forward keeps for the backward, and its logits
  std::size_t total() const { return parameters + gradients + optimizer + activations; }
};

// The estimate for a GPT of `config` trained with micro-batches of `micro_batch_size` sequences.
// Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
// Transformer Models", no tensor or sequence parallelism) per layer, generalised to GQA and the MLP
// width, without the attention-score term (Kiln's attention never stores the T x T scores):
// s b (4h [norms] + 2h + 2(q + 2kv) + 2q + h [attention] + 2h + 2F1 + 2F + h [MLP]) bytes at 16 bits
// (twice that in fp32), with F1 = 2F for SwiGLU; full recomputation keeps only each layer's input
// (2 s b h) plus one layer's worth. Plus the f32 logits of one micro-batch.
TrainingMemoryEstimate estimate_gpt_training_memory(const models::GptConfig& config, std::int64_t micro_batch_size,
                                                    bool bf16);

// "parameters 0.47 GiB + gradients 0.47 GiB + ... = 2.1 GiB"
std::string describe(const TrainingMemoryEstimate& estimate);

// The model's shape as Megatron flags ("--num-layers" -> "12", ...), in a fixed order: what a
// checkpoint records and a --load compares.
std::vector<std::pair<std::string, std::string>> gpt_shape_flags(const models::GptConfig& config);

// Validates the config (errors name the flags), refuses a run that does not fit in the device's
// free memory (printing the estimate and the free memory), builds the model and trains it.
// `all_flags` is the command line as flag -> value, kept in the checkpoints for the record.
GptTrainSummary pretrain_gpt(const models::GptConfig& config, const GptTrainOptions& options,
                             const std::vector<std::pair<std::string, std::string>>& all_flags,
                             const GptTrainCallbacks& callbacks = {});

}  // namespace kiln::train
