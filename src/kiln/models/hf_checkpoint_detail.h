#pragma once
// Internals shared by the Hugging Face interop files (models/hf_checkpoint.cpp: Llama and GPT-2,
// the directories; models/hf_checkpoint_moe.cpp: Mixtral and DeepSeek-V3): the tensor and
// config.json helpers, and the architecture-specific pieces each file provides the other.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "kiln/models/hf_checkpoint.h"
#include "kiln/runtime/error.h"

namespace kiln::models::hf_detail {

using json = nlohmann::json;

// The resolved sizes (GptConfig's 0 fields mean Megatron's defaults).
struct Sizes {
  std::int64_t layers, hidden, heads, groups, head_dim, ffn, vocab, padded_vocab, positions;
};

inline Sizes sizes_of(const GptConfig& c) {
  return {c.num_layers,   c.hidden_size, c.num_attention_heads, c.query_groups(), c.head_dim(),
          c.ffn_hidden(), c.vocab_size,  c.padded_vocab_size(), c.max_positions()};
}

inline std::string layer(std::int64_t i, std::string_view rest) { return fmt::format("decoder.layers.{}.{}", i, rest); }

// A tensor of `dict` (`what` names the dict in messages) with the expected shape, as a CPU tensor.
inline Tensor take(const TensorDict& dict, const std::string& name, const Shape& shape, std::string_view what) {
  const Tensor* t = dict.find(name);
  KILN_CHECK(t != nullptr, "{}: the tensor '{}' is missing", what, name);
  KILN_CHECK(t->shape() == shape, "{}: '{}' has shape {}, the model's configuration needs {}", what, name,
             shape_str(t->shape()), shape_str(shape));
  return t->detach().to(Device::cpu());
}

inline Tensor compact(const Tensor& t) { return t.contiguous().clone(); }

// Rows [0, rows) of a [padded, H] embedding, and the inverse with zero padding.
inline Tensor trim_rows(const Tensor& t, std::int64_t rows) { return compact(t.narrow(0, 0, rows)); }
inline Tensor pad_rows(const Tensor& t, std::int64_t rows) {
  Tensor out = Tensor::zeros({rows, t.size(1)}, t.dtype());
  out.narrow(0, 0, t.size(0)).copy_(t);
  return out;
}

// Rows [a | b] of one tensor, and back.
inline Tensor stack_rows(const Tensor& a, const Tensor& b) {
  Shape shape = a.shape();
  shape[0] += b.size(0);
  Tensor out = Tensor::empty(shape, a.dtype());
  out.narrow(0, 0, a.size(0)).copy_(a);
  out.narrow(0, a.size(0), b.size(0)).copy_(b);
  return out;
}

// Field readers that name the file and the field.
struct ConfigReader {
  const json& j;
  const std::string& where;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  std::int64_t integer(const char* key) const {
    KILN_CHECK(has(key), "{}: the field '{}' is missing", where, key);
    KILN_CHECK(j[key].is_number_integer() && j[key].get<std::int64_t>() > 0,
               "{}: '{}' must be a whole number > 0, got {}", where, key, j[key].dump());
    return j[key].get<std::int64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    KILN_CHECK(j[key].is_number(), "{}: '{}' must be a number, got {}", where, key, j[key].dump());
    return j[key].get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    KILN_CHECK(j[key].is_boolean(), "{}: '{}' must be true or false, got {}", where, key, j[key].dump());
    return j[key].get<bool>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    KILN_CHECK(j[key].is_string(), "{}: '{}' must be a string, got {}", where, key, j[key].dump());
    return j[key].get<std::string>();
  }
};

// Tensors of a Hugging Face checkpoint, each taken at most once, so that what is left over at the
// end can be refused by name.
class HfTensors {
 public:
  HfTensors(const TensorDict& hf, HfArchitecture arch) {
    for (const auto& [name, t] : hf) {
      std::string key = name;
      // Published GPT-2 checkpoints name GPT2Model's tensors without the "transformer." prefix
      // that GPT2LMHeadModel.save_pretrained writes.
      if (arch == HfArchitecture::Gpt2 && !key.starts_with("transformer.") && key != "lm_head.weight") {
        key = "transformer." + key;
      }
      tensors_.insert(key, t);
    }
  }
  Tensor take(const std::string& name, const Shape& shape) {
    used_.insert(name);
    return hf_detail::take(tensors_, name, shape, "import-hf").to(DType::F32);
  }
  bool contains(const std::string& name) const { return tensors_.contains(name); }
  // Tensors under `prefix` are left alone by check_all_used (modules transformers does not load).
  void ignore_prefix(std::string prefix) { ignored_prefixes_.push_back(std::move(prefix)); }
  // Refuses tensors nobody took, except the buffers transformers saves that carry no weights.
  void check_all_used() const {
    std::vector<std::string> unknown;
    for (const auto& [name, t] : tensors_) {
      if (used_.count(name) != 0) continue;
      if (std::any_of(ignored_prefixes_.begin(), ignored_prefixes_.end(),
                      [&](const std::string& p) { return name.starts_with(p); }))
        continue;
      if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
          name.ends_with("rotary_emb.inv_freq")) {
        continue;
      }
      unknown.push_back(name);
    }
    if (unknown.empty()) return;
    std::string list;
    for (std::size_t i = 0; i < std::min<std::size_t>(unknown.size(), 5); ++i) list += (i ? ", " : "") + unknown[i];
    KILN_FAIL(
        "import-hf: {} tensor(s) the configuration has no place for, e.g. {} (a different architecture or "
        "config.json does not match the weights)",
        unknown.size(), list);
  }

 private:
  TensorDict tensors_;
  std::set<std::string> used_;
  std::vector<std::string> ignored_prefixes_;
};

// LlamaForCausalLM's config.json fields (models/hf_checkpoint.cpp); Mixtral's and DeepSeek-V3's
// readers start from it.
GptConfig llama_from_hf(const ConfigReader& r);

// ---- the Mixtral / DeepSeek-V3 pieces (models/hf_checkpoint_moe.cpp) ----

// Refuses (naming the flags) a MoE or MLA model that neither class reproduces; returns its class.
HfArchitecture moe_architecture_for(const GptConfig& c);
// The class's config.json fields beyond Llama's (which `j` already holds).
void moe_config_to_hf(const GptConfig& c, HfArchitecture arch, json& j);
// config.json of MixtralForCausalLM / DeepseekV3ForCausalLM read into a GptConfig.
GptConfig mixtral_from_hf(const ConfigReader& r);
GptConfig deepseek_v3_from_hf(const ConfigReader& r);

// One layer's MLA attention (DeepSeek-V3's self_attn.*) and MoE MLP (Mixtral's block_sparse_moe.*
// or DeepSeek-V3's mlp.*) between Megatron's names `layer(i, ...)` and HF's under prefix `p`
// ("model.layers.<i>.").
void mla_to_hf(const GptConfig& c, const TensorDict& m, std::int64_t i, const std::string& p, TensorDict& hf);
void mla_from_hf(const GptConfig& c, HfTensors& hf, std::int64_t i, const std::string& p, bool rope_interleave,
                 TensorDict& m);
void moe_to_hf(const GptConfig& c, HfArchitecture arch, const TensorDict& m, std::int64_t i, const std::string& p,
               TensorDict& hf);
void moe_from_hf(const GptConfig& c, HfArchitecture arch, HfTensors& hf, std::int64_t i, const std::string& p,
                 TensorDict& m);

}  // namespace kiln::models::hf_detail
