// The FP8 part of GptConfig: which layers run FP8 and whether the model's shapes allow FP8 GEMMs.
#include "kiln/models/gpt_config.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

bool GptConfig::is_fp8_layer(std::int64_t layer) const {
  if (!fp8) return false;
  if (!first_last_layers_bf16) return true;
  return layer >= num_layers_at_start_in_bf16 && layer < num_layers - num_layers_at_end_in_bf16;
}

void validate_fp8_config(const GptConfig& c) {
  if (!c.fp8) {
    KILN_CHECK(!c.first_last_layers_bf16, "GPT config: --first-last-layers-bf16 only applies with --fp8-format");
    return;
  }
  const te::Fp8Recipe& r = c.fp8_recipe;
  KILN_CHECK(r.amax_history_len >= 1, "GPT config: --fp8-amax-history-len must be at least 1, got {}",
             r.amax_history_len);
  KILN_CHECK(r.margin >= 0, "GPT config: --fp8-margin must be 0 or more, got {}", r.margin);
  if (c.first_last_layers_bf16) {
    KILN_CHECK(c.num_layers_at_start_in_bf16 >= 0 && c.num_layers_at_end_in_bf16 >= 0,
               "GPT config: --num-layers-at-start-in-bf16 ({}) and --num-layers-at-end-in-bf16 ({}) must be 0 or more",
               c.num_layers_at_start_in_bf16, c.num_layers_at_end_in_bf16);
    KILN_CHECK(c.num_layers_at_start_in_bf16 + c.num_layers_at_end_in_bf16 <= c.num_layers,
               "GPT config: --num-layers-at-start-in-bf16 ({}) + --num-layers-at-end-in-bf16 ({}) exceed --num-layers "
               "({})",
               c.num_layers_at_start_in_bf16, c.num_layers_at_end_in_bf16, c.num_layers);
  }
  // Parts without an FP8 path yet are refused rather than silently left in bf16.
  KILN_CHECK(c.num_experts == 0,
             "GPT config: --fp8-format with --num-experts: the experts' (grouped) GEMMs have no FP8 path yet; train "
             "MoE models without --fp8-format");
  KILN_CHECK(!c.multi_latent_attention,
             "GPT config: --fp8-format with --multi-latent-attention is not supported yet (MLA's low-rank projections "
             "have no FP8 path)");
  KILN_CHECK(c.mtp_num_layers == 0, "GPT config: --fp8-format with --mtp-num-layers is not supported yet");
  // A recomputed forward would cast (and so advance the amax history) twice per step.
  KILN_CHECK(!(r.recipe == te::Fp8ScalingRecipe::Delayed && c.recompute_granularity == RecomputeGranularity::Full),
             "GPT config: --fp8-recipe delayed with --recompute-granularity full would update the amax history twice "
             "per step (the recomputed forward casts again): use --fp8-recipe tensorwise or blockwise, or no full "
             "recompute");
  // FP8 GEMMs (cuBLASLt's rule, kept on the CPU too) need every dimension a multiple of 16.
  const std::int64_t fc1 = c.swiglu ? 2 * c.ffn_hidden() : c.ffn_hidden();
  const std::pair<const char*, std::int64_t> dims[] = {
      {"--hidden-size", c.hidden_size},
      {"the QKV width (heads + 2 groups) x head size", c.qkv_size()},
      {"heads x head size (--kv-channels)", c.num_attention_heads * c.head_dim()},
      {"--ffn-hidden-size", fc1}};
  for (const auto& [what, v] : dims)
    KILN_CHECK(v % 16 == 0, "GPT config: --fp8-format needs {} to be a multiple of 16 (FP8 GEMMs), got {}", what, v);
}

}  // namespace kiln::models
