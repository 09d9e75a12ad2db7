#pragma once
// Mixture of experts in the training loop: wires a model's routers (models/moe_router.h) into a
// LanguageModelHandle: the aux losses' gradient scale (1 / micro-batches, as the LM loss's), the
// expert-bias update after each optimizer step (DeepSeek-V3), and the log fields: per MoE layer the
// slots routed to each expert and those dropped over capacity since the last log line, and the mean
// load-balancing and z losses (coefficients applied) per layer and forward.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/models/gpt_config.h"
#include "kiln/models/moe_router.h"
#include "kiln/train/gpt_trainer.h"

namespace kiln::train {

// The routers below `model`, with their layer numbers (from decoder.layers.{i}), in layer order.
std::vector<std::pair<std::int64_t, std::shared_ptr<models::TopKRouter>>> moe_routers(const nn::Module& model);

// Pipeline parallelism: the pipeline group and the whole model's MoE layers (its stages hold
// different ones; a stage may hold none).
struct MoePipeline {
  dist::Communicator group;
  std::vector<std::int64_t> moe_layers;  // the whole model's, ascending
  std::int64_t num_experts = 0;
  // DualPipe: the pair of pipeline ranks {r, p - 1 - r}, which hold the same layers (one the
  // originals, the other the copies, each routing its direction's micro-batches): the expert-bias
  // update sums the copies' counts over it. The logged statistics need nothing more: the
  // gather over the pipeline group already sums each layer over the ranks that hold it.
  std::optional<dist::Communicator> dualpipe_pair;
};

// Sets the hooks of `handle` (nothing for a model without routers). `data_parallel`: the ranks that
// train on different samples (null or one rank: this process alone). Over it, as Megatron does, the
// expert-bias update's token counts are summed (its tensor-and-data-parallel group) and so are the
// logged loads, drops, aux losses and forwards (its MoE metrics tracker), so a data- or
// expert-parallel run logs and balances as the one-process run. (The aux losses themselves stay per
// micro-batch: Megatron reduces their token counts over the tensor- and context-parallel group only,
// which Kiln's MoE runs do not have.) Collective: every rank calls the hooks at the same steps.
// `pipeline`: `model` is one stage; each stage's backward gives its own layers' aux losses their
// gradient (they are attached to its activations; Megatron alike), and the logged statistics are
// every stage's layers', gathered over the pipeline group (so every rank logs the whole model's, as
// one process: the aux losses summed over all layers, divided by all layers' forwards).
void attach_moe_training(LanguageModelHandle& handle, const nn::Module& model, std::int64_t micro_batches,
                         std::optional<dist::Communicator> data_parallel = std::nullopt,
                         std::optional<MoePipeline> pipeline = std::nullopt);

// Collective over the pipeline group: every MoE layer's statistics of the whole model, in layer
// order, from each stage's own (layer, statistics).
std::vector<std::pair<std::int64_t, models::RouterStats>> gather_router_stats(
    const std::vector<std::pair<std::int64_t, models::RouterStats>>& mine, const MoePipeline& pipeline);

// The sum of every rank's statistics over `group` (collective).
models::RouterStats reduce_router_stats(models::RouterStats stats, const dist::Communicator& group);

// The MoE flags that fix the parameters' shapes and meaning, for checkpoints (none when dense).
void append_moe_shape_flags(const models::GptConfig& c, std::vector<std::pair<std::string, std::string>>& flags);

}  // namespace kiln::train
