#pragma once
// What generate and export-hf read from a pretrain-gpt checkpoint (train/gpt_checkpoint.h): the
// model's configuration rebuilt from the checkpoint's shape flags, its weights, and the tokenizer it
// was trained with (from the run's tokenizer flags); and the shape flags import-hf writes.
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

// Refuses, naming --load, a directory that is missing or holds no pretrain-gpt checkpoint.
CheckpointModel read_checkpoint_model(const std::filesystem::path& load);

// The model's shape flags in Megatron's names ("--num-layers" -> "12", "--swiglu" -> "true",
// "--position-embedding-type" -> "rope", ...), and back. Unknown flags are ignored on reading
// (pretrain-gpt may record more); a value that does not parse is refused naming the flag.
FlagList gpt_shape_flags(const models::GptConfig& config, bool bf16);
models::GptConfig gpt_config_from_shape_flags(const FlagList& flags, const std::string& where, bool* bf16 = nullptr);

// The tokenizer flags of a run (--tokenizer-type, --tokenizer-model, --vocab-file, --merge-file);
// relative paths are looked up under `base` first, then in the current directory.
data::TokenizerSpec tokenizer_from_flags(const FlagList& flags, const std::filesystem::path& base);
// The inverse, for a checkpoint written by import-hf.
FlagList tokenizer_flags(const data::TokenizerSpec& spec);

}  // namespace kiln::cli
