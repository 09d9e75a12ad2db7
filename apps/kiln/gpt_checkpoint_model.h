#pragma once
// What generate and export-hf read from a pretrain-gpt checkpoint (train/gpt_checkpoint.h): the
// model's configuration rebuilt from the flags the checkpoint records, its weights, and the
// tokenizer the run used; and what import-hf records for a checkpoint it writes.
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "kiln/data/tokenizer_factory.h"
#include "kiln/models/gpt_config.h"
#include "kiln/tensor/ordered_dict.h"

namespace kiln::cli {

using FlagList = std::vector<std::pair<std::string, std::string>>;

struct CheckpointModel {
  models::GptConfig config;
  bool bf16 = false;
  TensorDict weights;  // Megatron-core names
  data::TokenizerSpec tokenizer;
  std::int64_t iteration = 0;
};

// Refuses, naming --load, a directory that is missing or holds no pretrain-gpt checkpoint, and a
// checkpoint whose recorded model flags do not rebuild the same model (naming the flags).
CheckpointModel read_checkpoint_model(const std::filesystem::path& load);

// The config from a checkpoint's shape flags (train::gpt_shape_flags, plus --bf16) and the run's
// flags (--seq-length, --rope-scaling-factor, --make-vocab-size-divisible-by, the tokenizer or
// --vocab-size), checked against the shape flags it must reproduce. `where` names the checkpoint.
models::GptConfig gpt_config_from_checkpoint_flags(const FlagList& shape_flags, const FlagList& all_flags,
                                                   const std::filesystem::path& base, const std::string& where,
                                                   bool* bf16 = nullptr);

// The shape flags a checkpoint of `config` records (what pretrain-gpt compares on --load).
FlagList checkpoint_shape_flags(const models::GptConfig& config, bool bf16);

// The tokenizer flags of a run (--tokenizer-type, --tokenizer-model, --vocab-file, --merge-file);
// relative paths are looked up under `base` first, then in the current directory.
data::TokenizerSpec tokenizer_from_flags(const FlagList& flags, const std::filesystem::path& base);
// The inverse, for a checkpoint written by import-hf.
FlagList tokenizer_flags(const data::TokenizerSpec& spec);

}  // namespace kiln::cli
