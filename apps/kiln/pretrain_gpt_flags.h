#pragma once
// The flags of `kiln pretrain-gpt` (Megatron-LM's pretrain_gpt.py names), registered in one place
// for pretrain-gpt and for `kiln simulate`, so any run can be simulated by changing the command's
// name. simulate also takes the parallel-layout and MoE flags that pretrain-gpt refuses (with a
// message saying why) and needs neither data nor a learning rate.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fp8_flags.h"
#include "kiln/models/gpt_config.h"
#include "kiln/train/gpt_trainer.h"
#include "moe_flags.h"
#include "tokenizer_flags.h"

namespace kiln::cli {

enum class GptFlagsFor { PretrainGpt, Simulate };

// Megatron's parallel-layout flags (simulate only; the MoE flags are pretrain-gpt's own, moe_flags.h).
struct GptLayoutFlags {
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  std::int64_t num_layers_per_virtual_pipeline_stage = 0;  // 0: no interleaving
  int expert_model_parallel_size = 1;
  int expert_tensor_parallel_size = 1;                 // --expert-tensor-parallel-size
  std::int64_t decoder_first_pipeline_num_layers = 0;  // 0: an even split
  std::int64_t decoder_last_pipeline_num_layers = 0;
  int context_parallel_size = 1;
  bool sequence_parallel = false;
  bool tp_comm_overlap = false;
  bool use_distributed_optimizer = false;
  std::string cp_comm_type = "p2p";                    // --cp-comm-type
  std::string moe_token_dispatcher_type = "alltoall";  // --moe-token-dispatcher-type
};

struct PretrainGptFlags {
  models::GptConfig config;
  bool group_query_attention = false;
  bool disable_bias_linear = false;
  std::string position_embedding_type = "learned_absolute";
  std::string normalization = "LayerNorm";
  std::string transformer_impl = "local";
  std::string cp_comm_type = "p2p";  // --cp-comm-type
  std::string recompute_granularity;
  std::string recompute_method;
  TokenizerFlags tokenizer;
  std::int64_t vocab_size = 0;
  train::GptTrainOptions options;
  std::vector<std::string> data_path;
  std::string device;
  bool no_progress = false;
  bool no_gradient_accumulation_fusion = false;
  std::string skip_batches;
  std::map<std::string, std::string> unsupported_values;
  MoeFlags moe;
  Fp8Flags fp8;
  GptLayoutFlags layout;
  // pretrain-gpt's pipeline parallelism (simulate reads layout's): the stages and the schedule.
  int pipeline_model_parallel_size = 1;
  std::string pipeline_schedule;  // empty: interleaved with --num-layers-per-virtual-pipeline-stage, else 1f1b
};

// Registers every flag on `cmd` (options bound to `f`, which must outlive the parse).
void add_pretrain_gpt_flags(CLI::App* cmd, PretrainGptFlags& f, GptFlagsFor use);
// After the parse: checks the flags together, fills f.config and the parsed parts of f.options;
// throws CLI::ValidationError naming the flag.
void resolve_pretrain_gpt_flags(CLI::App* cmd, PretrainGptFlags& f, GptFlagsFor use);

}  // namespace kiln::cli
