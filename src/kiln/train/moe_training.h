#pragma once
// Mixture of experts in the training loop: wires a model's routers (models/moe_router.h) into a
// LanguageModelHandle: the aux losses' gradient scale (1 / micro-batches, as the LM loss's), the
// expert-bias update after each optimizer step (DeepSeek-V3), and the log fields: per MoE layer the
// slots routed to each expert and those dropped over capacity since the last log line, and the mean
// load-balancing and z losses (coefficients applied) per layer and forward.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/models/gpt_config.h"
#include "kiln/models/moe_router.h"
#include "kiln/train/gpt_trainer.h"

namespace kiln::train {

// The routers below `model`, with their layer numbers (from decoder.layers.{i}), in layer order.
std::vector<std::pair<std::int64_t, std::shared_ptr<models::TopKRouter>>> moe_routers(const nn::Module& model);

// Sets the hooks of `handle` (nothing for a model without routers).
void attach_moe_training(LanguageModelHandle& handle, const nn::Module& model, std::int64_t micro_batches);

// The MoE flags that fix the parameters' shapes and meaning, for checkpoints (none when dense).
void append_moe_shape_flags(const models::GptConfig& c, std::vector<std::pair<std::string, std::string>>& flags);

}  // namespace kiln::train
