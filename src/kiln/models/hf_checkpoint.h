#pragma once
// Hugging Face interop: a Kiln GPT (Megatron-core parameter names and layouts, models/gpt_model.h)
// as a `transformers` directory and back.
//   Llama style (RoPE, RMSNorm, SwiGLU) <-> LlamaForCausalLM: linear_qkv's grouped rows split into
//     q_proj / k_proj / v_proj, linear_fc1 into gate_proj / up_proj.
//   GPT-2 style (learned positions, LayerNorm, GELU(tanh), biases) <-> GPT2LMHeadModel: Conv1D
//     weights stored transposed ([in, out]), c_attn the q | k | v blocks one after the other.
//   Llama style with MoE MLPs in every layer (softmax top-k router) <-> MixtralForCausalLM:
//     block_sparse_moe.gate (the router), experts.<e>.w1 / w3 / w2 (gate / up / down).
//   MLA attention, sigmoid-routed MoE after the first dense layers, shared experts <->
//     DeepseekV3ForCausalLM: q_a_proj / q_a_layernorm / q_b_proj (or q_proj), kv_a_proj_with_mqa /
//     kv_a_layernorm / kv_b_proj, mlp.gate (+ e_score_correction_bias: the expert bias),
//     mlp.experts.<e>.*, mlp.shared_experts.* (models/hf_checkpoint_moe.cpp).
// The embedding's padded rows (Megatron rounds the vocabulary up) are trimmed to the tokenizer's
// vocabulary on export and come back as zeros on import. A directory holds config.json,
// model.safetensors and the tokenizer files; it is written under a temporary name and renamed.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/data/tokenizer_factory.h"
#include "kiln/models/gpt_config.h"
#include "kiln/tensor/ordered_dict.h"

namespace kiln::models {

enum class HfArchitecture { Llama, Gpt2, Mixtral, DeepseekV3 };

// "LlamaForCausalLM", "GPT2LMHeadModel", "MixtralForCausalLM" or "DeepseekV3ForCausalLM".
std::string_view hf_architecture_name(HfArchitecture architecture);

// Which Hugging Face class holds this model; throws kiln::Error naming the Megatron flags that
// fit neither (for example LayerNorm with RoPE, or SwiGLU with learned positions).
HfArchitecture hf_architecture_for(const GptConfig& config);

// config.json for the model. bos/eos: the tokenizer's ids (null when absent). `dtype` names the
// tensors' type (torch_dtype).
std::string hf_config_json(const GptConfig& config, std::optional<std::int64_t> bos_token_id,
                           std::optional<std::int64_t> eos_token_id, DType dtype);

// Reads config.json text (`where` names the file in messages) into a GptConfig. Architectures
// other than the two above, and fields whose values Kiln's model cannot reproduce (another
// activation, another rope_scaling type, separate attention and MLP biases, ...), are refused
// naming the field. seq_length 0 takes the model's maximum positions.
GptConfig gpt_config_from_hf(std::string_view config_json, const std::string& where, std::int64_t seq_length = 0);

// Megatron-named parameters -> Hugging Face names and layouts (contiguous CPU tensors, the
// parameters' dtype). Throws naming a parameter that is missing or has the wrong shape.
TensorDict megatron_to_hf(const GptConfig& config, const TensorDict& megatron);
// The inverse; the padded vocabulary rows are zeros. Unknown tensor names are refused by name.
// rope_interleave (DeepSeek-V3's config field): the checkpoint's RoPE channels of q_b_proj / q_proj
// and kv_a_proj_with_mqa are stored interleaved (pairs (2i, 2i+1)), as DeepSeek publishes them;
// they are permuted into the halves Kiln's RoPE rotates. Kiln's export writes rope_interleave false.
TensorDict hf_to_megatron(const GptConfig& config, const TensorDict& hf, bool rope_interleave = false);
// config.json's rope_interleave for DeepseekV3ForCausalLM (transformers' default: true); false for
// the other classes.
bool hf_rope_interleave(std::string_view config_json);

// Writes <out>/config.json, model.safetensors and the tokenizer's files (GPT-2: vocab.json,
// merges.txt; Hugging Face: tokenizer.json and tokenizer_config.json when present) plus a
// tokenizer_config.json for GPT-2. The directory appears complete or not at all; an existing
// <out> is replaced only when it is an earlier export (holds config.json), otherwise refused.
void write_hf_directory(const std::filesystem::path& out, const GptConfig& config, const TensorDict& megatron,
                        const data::TokenizerSpec& tokenizer);

struct HfDirectory {
  GptConfig config;
  TensorDict megatron;            // f32 CPU tensors with Megatron's names
  data::TokenizerSpec tokenizer;  // pointing at the files in the directory
};

// Reads what write_hf_directory writes, or a published model directory of the same two classes
// (model.safetensors, or several shards listed by model.safetensors.index.json).
HfDirectory read_hf_directory(const std::filesystem::path& dir, std::int64_t seq_length = 0);

}  // namespace kiln::models
