// The FP8 part of GptConfig: which layers run FP8 and whether the model's shapes allow FP8 GEMMs.
#include <utility>
#include <vector>

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
    KILN_CHECK(!c.fp8_param_gather, "GPT config: --fp8-param-gather only applies with --fp8-format");
    return;
  }
  if (c.fp8_param_gather) {
    // The experts' grouped linears (te/fp8_grouped_linear.h) keep their weights in the model's dtype.
    KILN_CHECK(c.num_experts == 0,
               "GPT config: --fp8-param-gather with --num-experts is not supported (the MoE experts' weights are not "
               "kept in FP8); leave one of them out");
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
  // A recomputed forward would cast (and so advance the amax history) twice per step.
  KILN_CHECK(!(r.recipe == te::Fp8ScalingRecipe::Delayed && c.recompute_granularity == RecomputeGranularity::Full),
             "GPT config: --fp8-recipe delayed with --recompute-granularity full would update the amax history twice "
             "per step (the recomputed forward casts again): use --fp8-recipe tensorwise or blockwise, or no full "
             "recompute");
  // FP8 GEMMs (cuBLASLt's rule, kept on the CPU too) need every dimension a multiple of 16. MLA's
  // projections that miss it stay in the model's dtype instead (transformer_mla.cpp), so MLA adds none.
  std::vector<std::pair<const char*, std::int64_t>> dims = {{"--hidden-size", c.hidden_size}};
  if (!c.multi_latent_attention) {
    dims.emplace_back("the QKV width (heads + 2 groups) x head size", c.qkv_size());
    dims.emplace_back("heads x head size (--kv-channels)", c.num_attention_heads * c.head_dim());
  }
  bool dense_mlp = c.mtp_num_layers > 0;  // the MTP modules' layers have dense MLPs
  for (std::int64_t i = 0; i < c.num_layers && !dense_mlp; ++i) dense_mlp = !c.is_moe_layer(i);
  const std::int64_t glu = c.swiglu ? 2 : 1;  // SwiGLU's fc1 holds gate and up
  if (dense_mlp) dims.emplace_back("--ffn-hidden-size", glu * c.ffn_hidden());
  if (c.num_experts > 0) {
    dims.emplace_back("--moe-ffn-hidden-size", glu * c.moe_ffn_hidden());
    if (c.moe_shared_expert_intermediate_size > 0)
      dims.emplace_back("--moe-shared-expert-intermediate-size", glu * c.moe_shared_expert_intermediate_size);
  }
  for (const auto& [what, v] : dims)
    KILN_CHECK(v % 16 == 0, "GPT config: --fp8-format needs {} to be a multiple of 16 (FP8 GEMMs), got {}", what, v);
}

}  // namespace kiln::models
