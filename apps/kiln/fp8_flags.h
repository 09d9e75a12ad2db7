#pragma once
// pretrain-gpt's FP8 flags (Megatron-LM's --fp8-* and --first-last-layers-bf16), into a
// models::GptConfig; GptConfig::validate() judges the model's side, these functions the flags'.
#include <CLI/CLI.hpp>
#include <string>

#include "kiln/models/gpt_config.h"

namespace kiln::cli {

struct Fp8Flags {
  std::string format;  // empty: no FP8
  std::string recipe = "delayed";
  std::string amax_compute_algo = "most_recent";
};

void add_fp8_flags(CLI::App* cmd, models::GptConfig& c, Fp8Flags& f);
// After parsing: the string-valued flags into the config, and the checks that need to know which
// flags were given; refuses a recipe `device` cannot run. Throws CLI::ValidationError naming the flag.
void apply_fp8_flags(const CLI::App* cmd, const Fp8Flags& f, Device device, models::GptConfig& c);

}  // namespace kiln::cli
