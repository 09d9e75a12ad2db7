#include "fp8_flags.h"

#include "number_checks.h"

namespace kiln::cli {

void add_fp8_flags(CLI::App* cmd, models::GptConfig& c, Fp8Flags& f) {
  const char* group = "FP8";
  cmd->add_option("--fp8-format", f.format, "FP8 GEMMs in the decoder layers: e4m3, or hybrid (e5m2 gradients)")
      ->check(CLI::IsMember({"e4m3", "hybrid"}))
      ->group(group);
  cmd->add_option("--fp8-recipe", f.recipe,
                  "scaling: delayed (amax history), tensorwise (current amax), blockwise (1x128 / 128x128, "
                  "DeepSeek-V3), mxfp8 (refused: Blackwell only)")
      ->check(CLI::IsMember({"delayed", "tensorwise", "blockwise", "mxfp8", "mxfp8-if-supported"}))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--fp8-amax-history-len", c.fp8_recipe.amax_history_len, "delayed: amax history window")
      ->check(whole_number_at_least(1))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--fp8-amax-compute-algo", f.amax_compute_algo, "delayed: max or most_recent amax of the window")
      ->check(CLI::IsMember({"max", "most_recent"}))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--fp8-margin", c.fp8_recipe.margin, "delayed: scale = fp8_max / amax / 2^margin")
      ->check(whole_number_at_least(0))
      ->capture_default_str()
      ->group(group);
  cmd->add_flag("--fp8-param-gather", c.fp8_param_gather,
                "keep the FP8 linears' weights in FP8 only: no 16-bit copy, the optimizer's fp32 masters cast "
                "straight to FP8 after each step and all-gathered in FP8 with --use-distributed-optimizer")
      ->group(group);
  cmd->add_flag("--first-last-layers-bf16", c.first_last_layers_bf16, "keep the first and last layers in bf16")
      ->group(group);
  cmd->add_option("--num-layers-at-start-in-bf16", c.num_layers_at_start_in_bf16,
                  "with --first-last-layers-bf16: leading bf16 layers")
      ->check(whole_number_at_least(0))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--num-layers-at-end-in-bf16", c.num_layers_at_end_in_bf16,
                  "with --first-last-layers-bf16: trailing bf16 layers")
      ->check(whole_number_at_least(0))
      ->capture_default_str()
      ->group(group);
}

void apply_fp8_flags(const CLI::App* cmd, const Fp8Flags& f, Device device, models::GptConfig& c) {
  c.fp8 = !f.format.empty();
  if (!c.fp8) {
    for (const char* flag : {"--fp8-recipe", "--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin",
                             "--fp8-param-gather", "--first-last-layers-bf16"})
      if (cmd->count(flag) > 0) throw CLI::ValidationError(flag, "only applies with --fp8-format e4m3 or hybrid");
    return;
  }
  for (const char* flag : {"--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16"})
    if (cmd->count(flag) > 0 && !c.first_last_layers_bf16)
      throw CLI::ValidationError(flag, "only applies with --first-last-layers-bf16");
  c.fp8_recipe.format = te::parse_fp8_format(f.format);
  c.fp8_recipe.recipe = te::parse_fp8_recipe(f.recipe);
  c.fp8_recipe.amax_compute_algo = te::parse_amax_compute_algo(f.amax_compute_algo);
  if (c.fp8_recipe.recipe != te::Fp8ScalingRecipe::Delayed)
    for (const char* flag : {"--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin"})
      if (cmd->count(flag) > 0)
        throw CLI::ValidationError(flag, "only applies with --fp8-recipe delayed (the " +
                                             std::string(te::to_string(c.fp8_recipe.recipe)) +
                                             " recipe computes each scale from the tensor's own amax)");
  const std::string why = te::fp8_recipe_unsupported_reason(c.fp8_recipe, device);
  if (!why.empty()) throw CLI::ValidationError("--fp8-recipe", why);
}

}  // namespace kiln::cli
