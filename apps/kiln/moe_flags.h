#pragma once
// pretrain-gpt's mixture-of-experts flags (Megatron-LM's --num-experts and --moe-*), into a
// models::GptConfig; GptConfig::validate() judges their consistency, naming the flags.
#include <CLI/CLI.hpp>
#include <string>

#include "kiln/models/gpt_config.h"

namespace kiln::cli {

struct MoeFlags {
  std::string score_function = "softmax";
  std::string load_balancing_type = "aux_loss";
  std::string token_drop_policy = "probs";
  std::string layer_freq = "1";
  // Expert parallelism (pretrain-gpt only: add_expert_parallel_flags).
  std::string token_dispatcher_type = "alltoall";
};

void add_moe_flags(CLI::App* cmd, models::GptConfig& c, MoeFlags& f);
// pretrain-gpt's expert-parallel flags (--expert-model-parallel-size, --moe-token-dispatcher-type,
// --expert-tensor-parallel-size).
void add_expert_parallel_flags(CLI::App* cmd, models::GptConfig& c, MoeFlags& f);
// After parsing: the string-valued flags into the config.
void apply_moe_flags(const CLI::App* cmd, const MoeFlags& f, models::GptConfig& c);

}  // namespace kiln::cli
