#include "kiln/models/hf_checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "kiln/data/gpt2_tokenizer_json.h"
#include "kiln/data/tokenizer_files.h"
#include "kiln/io/atomic_file.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/hf_checkpoint_detail.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

namespace fs = std::filesystem;
using namespace hf_detail;

namespace {

// The pieces of Megatron's grouped QKV projection. Its rows (or, for a bias, entries) go per query
// group: the group's heads/groups query heads, then its key head, then its value head.
struct QkvParts {
  Tensor q, k, v;  // [heads*d, ...], [groups*d, ...], [groups*d, ...]
};

QkvParts split_qkv(const Tensor& qkv, const Sizes& s) {
  const std::int64_t per_group = s.heads / s.groups;
  Shape grouped{s.groups, per_group + 2, s.head_dim};
  Shape tail;
  if (qkv.dim() == 2) tail = {qkv.size(1)};
  auto shaped = [&](std::int64_t rows) {
    Shape out{rows};
    out.insert(out.end(), tail.begin(), tail.end());
    return out;
  };
  Shape full = grouped;
  full.insert(full.end(), tail.begin(), tail.end());
  const Tensor g = qkv.contiguous().view(full);
  return {compact(g.narrow(1, 0, per_group).reshape(shaped(s.heads * s.head_dim))),
          compact(g.select(1, per_group).reshape(shaped(s.groups * s.head_dim))),
          compact(g.select(1, per_group + 1).reshape(shaped(s.groups * s.head_dim)))};
}

Tensor join_qkv(const QkvParts& p, const Sizes& s) {
  const std::int64_t per_group = s.heads / s.groups;
  Shape tail;
  if (p.q.dim() == 2) tail = {p.q.size(1)};
  auto with_tail = [&](Shape head) {
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };
  Tensor g = Tensor::empty(with_tail({s.groups, per_group + 2, s.head_dim}), p.q.dtype());
  g.narrow(1, 0, per_group).copy_(p.q.contiguous().view(with_tail({s.groups, per_group, s.head_dim})));
  g.select(1, per_group).copy_(p.k.contiguous().view(with_tail({s.groups, s.head_dim})));
  g.select(1, per_group + 1).copy_(p.v.contiguous().view(with_tail({s.groups, s.head_dim})));
  return g.reshape(with_tail({(s.heads + 2 * s.groups) * s.head_dim}));
}

// GPT-2's c_attn holds all query heads, then all key heads, then all value heads; with one key
// head per query head Megatron's QKV is the same blocks interleaved per head.
Tensor concat_three(const Tensor& a, const Tensor& b, const Tensor& c) { return stack_rows(stack_rows(a, b), c); }

constexpr std::string_view kExportWhat = "export-hf (the Kiln checkpoint)";

}  // namespace

std::string_view hf_architecture_name(HfArchitecture architecture) {
  switch (architecture) {
    case HfArchitecture::Llama: return "LlamaForCausalLM";
    case HfArchitecture::Gpt2: return "GPT2LMHeadModel";
    case HfArchitecture::Mixtral: return "MixtralForCausalLM";
    case HfArchitecture::DeepseekV3: return "DeepseekV3ForCausalLM";
  }
  return "unknown";
}

HfArchitecture hf_architecture_for(const GptConfig& c) {
  // MoE, MLA, MTP: Mixtral or DeepSeek-V3 (models/hf_checkpoint_moe.cpp), or refused there.
  if (c.num_experts > 0 || c.multi_latent_attention || c.mtp_num_layers > 0) return moe_architecture_for(c);
  const bool rope = c.position_embedding_type == PositionEmbedding::Rope;
  const bool learned = c.position_embedding_type == PositionEmbedding::LearnedAbsolute;
  const bool rms = c.normalization == Normalization::RMSNorm;
  if (rope && rms && c.swiglu) return HfArchitecture::Llama;
  if (learned && !rms && !c.swiglu) {
    const Sizes s = sizes_of(c);
    KILN_CHECK(c.add_bias_linear,
               "export-hf: a GPT-2 style model (learned positions, LayerNorm, GELU) needs biases "
               "(GPT2LMHeadModel has them), but the model was trained with --disable-bias-linear");
    KILN_CHECK(s.groups == s.heads,
               "export-hf: GPT2LMHeadModel has no grouped-query attention, but --num-query-groups is {} with {} heads",
               s.groups, s.heads);
    KILN_CHECK(
        s.head_dim * s.heads == s.hidden,
        "export-hf: GPT2LMHeadModel needs --kv-channels x --num-attention-heads = --hidden-size, got {} x {} != {}",
        s.head_dim, s.heads, s.hidden);
    return HfArchitecture::Gpt2;
  }
  KILN_FAIL(
      "export-hf: the model fits neither LlamaForCausalLM (--position-embedding-type rope, --normalization RMSNorm, "
      "--swiglu) nor GPT2LMHeadModel (--position-embedding-type learned_absolute, --normalization LayerNorm, no "
      "--swiglu); it has position embedding {}, {}, swiglu {}",
      rope ? "rope" : (learned ? "learned_absolute" : "none"), rms ? "RMSNorm" : "LayerNorm", c.swiglu ? "on" : "off");
}

std::string hf_config_json(const GptConfig& c, std::optional<std::int64_t> bos, std::optional<std::int64_t> eos,
                           DType dtype) {
  const auto arch = hf_architecture_for(c);
  const Sizes s = sizes_of(c);
  const std::string torch_dtype = dtype == DType::BF16 ? "bfloat16" : (dtype == DType::F16 ? "float16" : "float32");
  json j;
  j["architectures"] = json::array({std::string(hf_architecture_name(arch))});
  j["bos_token_id"] = bos ? json(*bos) : json(nullptr);
  j["eos_token_id"] = eos ? json(*eos) : json(nullptr);
  j["initializer_range"] = c.init_method_std;
  j["tie_word_embeddings"] = !c.untie_embeddings_and_output_weights;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  j["vocab_size"] = s.vocab;
  if (arch != HfArchitecture::Gpt2) {  // Llama, and the fields Mixtral and DeepSeek-V3 share with it
    j["model_type"] = "llama";
    j["hidden_size"] = s.hidden;
    j["intermediate_size"] = s.ffn;
    j["num_hidden_layers"] = s.layers;
    j["num_attention_heads"] = s.heads;
    j["num_key_value_heads"] = s.groups;
    j["head_dim"] = s.head_dim;
    j["max_position_embeddings"] = s.positions;
    j["rms_norm_eps"] = c.norm_epsilon;
    j["rope_theta"] = c.rotary_base;
    if (c.rope_llama3_scaling) {
      // Kiln's Llama-3 scaling uses Llama 3.1's constants (gpt_config.h).
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope_scaling_factor},
                           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 8192}};
    } else {
      j["rope_scaling"] = nullptr;
    }
    j["attention_bias"] = c.add_bias_linear;
    j["mlp_bias"] = c.add_bias_linear;
    j["hidden_act"] = "silu";
    j["attention_dropout"] = c.attention_dropout;
    j["pretraining_tp"] = 1;
    if (arch != HfArchitecture::Llama) moe_config_to_hf(c, arch, j);
  } else {
    j["model_type"] = "gpt2";
    j["n_positions"] = s.positions;
    j["n_ctx"] = s.positions;
    j["n_embd"] = s.hidden;
    j["n_layer"] = s.layers;
    j["n_head"] = s.heads;
    j["n_inner"] = s.ffn;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = c.norm_epsilon;
    j["resid_pdrop"] = c.hidden_dropout;
    j["embd_pdrop"] = c.hidden_dropout;
    j["attn_pdrop"] = c.attention_dropout;
    j["scale_attn_weights"] = true;
  }
  return j.dump(2) + "\n";
}

GptConfig hf_detail::llama_from_hf(const ConfigReader& r) {
  GptConfig c;
  c.num_layers = r.integer("num_hidden_layers");
  c.hidden_size = r.integer("hidden_size");
  c.ffn_hidden_size = r.integer("intermediate_size");
  c.num_attention_heads = r.integer("num_attention_heads");
  c.num_query_groups = r.has("num_key_value_heads") ? r.integer("num_key_value_heads") : c.num_attention_heads;
  c.kv_channels = r.has("head_dim") ? r.integer("head_dim") : c.hidden_size / c.num_attention_heads;
  c.max_position_embeddings = r.integer("max_position_embeddings");
  c.vocab_size = r.integer("vocab_size");
  c.position_embedding_type = PositionEmbedding::Rope;
  c.rotary_base = r.number("rope_theta", 10000);
  c.normalization = Normalization::RMSNorm;
  c.norm_epsilon = r.number("rms_norm_eps", 1e-6);
  c.swiglu = true;
  const std::string act = r.text("hidden_act", "silu");
  KILN_CHECK(act == "silu", "{}: hidden_act '{}' is not supported (Kiln's SwiGLU uses silu)", r.where, act);
  const bool attention_bias = r.flag("attention_bias", false);
  const bool mlp_bias = r.flag("mlp_bias", false);
  KILN_CHECK(attention_bias == mlp_bias,
             "{}: attention_bias ({}) and mlp_bias ({}) differ; Kiln has one switch for both (--disable-bias-linear)",
             r.where, attention_bias, mlp_bias);
  c.add_bias_linear = attention_bias;
  c.untie_embeddings_and_output_weights = !r.flag("tie_word_embeddings", false);
  c.attention_dropout = r.number("attention_dropout", 0);
  c.hidden_dropout = 0;
  c.init_method_std = r.number("initializer_range", 0.02);
  if (r.has("rope_scaling")) {
    const json& rs = r.j["rope_scaling"];
    KILN_CHECK(rs.is_object(), "{}: rope_scaling must be an object or null, got {}", r.where, rs.dump());
    const std::string type = rs.value("rope_type", rs.value("type", std::string()));
    KILN_CHECK(type == "llama3", "{}: rope_scaling type '{}' is not supported (Kiln implements llama3)", r.where, type);
    auto constant = [&](const char* key, double want) {
      const double got = rs.value(key, want);
      KILN_CHECK(got == want, "{}: rope_scaling.{} is {}, Kiln's llama3 scaling uses {}", r.where, key, got, want);
    };
    constant("low_freq_factor", 1.0);
    constant("high_freq_factor", 4.0);
    constant("original_max_position_embeddings", 8192.0);
    c.rope_llama3_scaling = true;
    KILN_CHECK(rs.contains("factor") && rs["factor"].is_number(), "{}: rope_scaling.factor is missing", r.where);
    c.rope_scaling_factor = rs["factor"].get<double>();
  }
  return c;
}

namespace {

GptConfig gpt2_from_hf(const ConfigReader& r) {
  GptConfig c;
  c.num_layers = r.integer("n_layer");
  c.hidden_size = r.integer("n_embd");
  c.num_attention_heads = r.integer("n_head");
  c.ffn_hidden_size = r.has("n_inner") ? r.integer("n_inner") : 4 * c.hidden_size;
  c.max_position_embeddings = r.integer("n_positions");
  c.vocab_size = r.integer("vocab_size");
  c.position_embedding_type = PositionEmbedding::LearnedAbsolute;
  c.normalization = Normalization::LayerNorm;
  c.norm_epsilon = r.number("layer_norm_epsilon", 1e-5);
  c.swiglu = false;
  c.add_bias_linear = true;
  c.untie_embeddings_and_output_weights = !r.flag("tie_word_embeddings", true);
  c.attention_dropout = r.number("attn_pdrop", 0.1);
  c.hidden_dropout = r.number("resid_pdrop", 0.1);
  c.init_method_std = r.number("initializer_range", 0.02);
  const std::string act = r.text("activation_function", "gelu_new");
  KILN_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
             "{}: activation_function '{}' is not supported (Kiln's GPT uses GELU with the tanh approximation: "
             "gelu_new)",
             r.where, act);
  KILN_CHECK(r.flag("scale_attn_weights", true), "{}: scale_attn_weights false is not supported", r.where);
  KILN_CHECK(!r.flag("scale_attn_by_inverse_layer_idx", false),
             "{}: scale_attn_by_inverse_layer_idx true is not supported", r.where);
  KILN_CHECK(!r.flag("add_cross_attention", false), "{}: add_cross_attention true is not supported", r.where);
  KILN_CHECK(c.hidden_size % c.num_attention_heads == 0, "{}: n_embd {} is not a multiple of n_head {}", r.where,
             c.hidden_size, c.num_attention_heads);
  return c;
}

}  // namespace

GptConfig gpt_config_from_hf(std::string_view text, const std::string& where, std::int64_t seq_length) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    KILN_FAIL("{}: not valid JSON ({})", where, e.what());
  }
  KILN_CHECK(j.is_object(), "{}: expected a JSON object", where);
  KILN_CHECK(j.contains("architectures") && j["architectures"].is_array() && j["architectures"].size() == 1 &&
                 j["architectures"][0].is_string(),
             "{}: 'architectures' must list one class, got {}", where,
             j.contains("architectures") ? j["architectures"].dump() : std::string("nothing"));
  const std::string arch = j["architectures"][0].get<std::string>();
  const ConfigReader reader{j, where};
  GptConfig c;
  if (arch == "LlamaForCausalLM") {
    c = llama_from_hf(reader);
  } else if (arch == "GPT2LMHeadModel") {
    c = gpt2_from_hf(reader);
  } else if (arch == "MixtralForCausalLM") {
    c = mixtral_from_hf(reader);
  } else if (arch == "DeepseekV3ForCausalLM") {
    c = deepseek_v3_from_hf(reader);
  } else {
    KILN_FAIL(
        "{}: architecture '{}' is not supported (Kiln reads LlamaForCausalLM, GPT2LMHeadModel, MixtralForCausalLM and "
        "DeepseekV3ForCausalLM)",
        where, arch);
  }
  KILN_CHECK(seq_length >= 0, "import-hf: --seq-length must be >= 0, got {}", seq_length);
  c.seq_length = seq_length > 0 ? seq_length : c.max_position_embeddings;
  KILN_CHECK(c.seq_length <= c.max_position_embeddings,
             "import-hf: --seq-length {} is more than the model's {} positions (max_position_embeddings / "
             "n_positions in {})",
             c.seq_length, c.max_position_embeddings, where);
  c.validate();
  return c;
}

bool hf_rope_interleave(std::string_view config_json) {
  const json j = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("architectures") || !j["architectures"].is_array() || j["architectures"].empty() ||
      j["architectures"][0] != "DeepseekV3ForCausalLM")
    return false;
  return !j.contains("rope_interleave") || !j["rope_interleave"].is_boolean() || j["rope_interleave"].get<bool>();
}

TensorDict megatron_to_hf(const GptConfig& c, const TensorDict& m) {
  const auto arch = hf_architecture_for(c);
  const Sizes s = sizes_of(c);
  const std::string_view what = kExportWhat;
  const std::int64_t qkv_rows = (s.heads + 2 * s.groups) * s.head_dim;
  const std::int64_t attn_width = s.heads * s.head_dim;
  const bool bias = c.add_bias_linear;
  const bool swiglu = c.swiglu;
  const std::int64_t fc1_rows = swiglu ? 2 * s.ffn : s.ffn;
  TensorDict hf;
  const Tensor embed = take(m, "embedding.word_embeddings.weight", {s.padded_vocab, s.hidden}, what);
  const bool norm_bias = c.normalization == Normalization::LayerNorm;
  auto norm = [&](const std::string& name, const std::string& to) {
    hf.insert(to + ".weight", compact(take(m, name + ".weight", {s.hidden}, what)));
    if (norm_bias) hf.insert(to + ".bias", compact(take(m, name + ".bias", {s.hidden}, what)));
  };
  // Llama's attention and dense MLP of layer i (HF prefix p); Mixtral shares the attention,
  // DeepSeek-V3 the dense MLP of its first layers.
  auto llama_attention_to_hf = [&](std::int64_t i, const std::string& p) {
    auto qkv = split_qkv(take(m, layer(i, "self_attention.linear_qkv.weight"), {qkv_rows, s.hidden}, what), s);
    hf.insert(p + "self_attn.q_proj.weight", qkv.q);
    hf.insert(p + "self_attn.k_proj.weight", qkv.k);
    hf.insert(p + "self_attn.v_proj.weight", qkv.v);
    if (bias) {
      auto b = split_qkv(take(m, layer(i, "self_attention.linear_qkv.bias"), {qkv_rows}, what), s);
      hf.insert(p + "self_attn.q_proj.bias", b.q);
      hf.insert(p + "self_attn.k_proj.bias", b.k);
      hf.insert(p + "self_attn.v_proj.bias", b.v);
    }
    hf.insert(p + "self_attn.o_proj.weight",
              compact(take(m, layer(i, "self_attention.linear_proj.weight"), {s.hidden, attn_width}, what)));
    if (bias) {
      hf.insert(p + "self_attn.o_proj.bias",
                compact(take(m, layer(i, "self_attention.linear_proj.bias"), {s.hidden}, what)));
    }
  };
  auto dense_mlp_to_hf = [&](std::int64_t i, const std::string& p) {
    const Tensor fc1 = take(m, layer(i, "mlp.linear_fc1.weight"), {fc1_rows, s.hidden}, what);
    hf.insert(p + "mlp.gate_proj.weight", compact(fc1.narrow(0, 0, s.ffn)));
    hf.insert(p + "mlp.up_proj.weight", compact(fc1.narrow(0, s.ffn, s.ffn)));
    if (bias) {
      const Tensor b1 = take(m, layer(i, "mlp.linear_fc1.bias"), {fc1_rows}, what);
      hf.insert(p + "mlp.gate_proj.bias", compact(b1.narrow(0, 0, s.ffn)));
      hf.insert(p + "mlp.up_proj.bias", compact(b1.narrow(0, s.ffn, s.ffn)));
    }
    hf.insert(p + "mlp.down_proj.weight", compact(take(m, layer(i, "mlp.linear_fc2.weight"), {s.hidden, s.ffn}, what)));
    if (bias) hf.insert(p + "mlp.down_proj.bias", compact(take(m, layer(i, "mlp.linear_fc2.bias"), {s.hidden}, what)));
  };
  if (arch != HfArchitecture::Gpt2) {  // Llama, Mixtral, DeepSeek-V3
    hf.insert("model.embed_tokens.weight", trim_rows(embed, s.vocab));
    for (std::int64_t i = 0; i < s.layers; ++i) {
      const std::string p = fmt::format("model.layers.{}.", i);
      norm(layer(i, "input_layernorm"), p + "input_layernorm");
      if (arch == HfArchitecture::DeepseekV3) {
        mla_to_hf(c, m, i, p, hf);
      } else {
        llama_attention_to_hf(i, p);
      }
      norm(layer(i, "pre_mlp_layernorm"), p + "post_attention_layernorm");
      if (c.is_moe_layer(i)) {
        moe_to_hf(c, arch, m, i, p, hf);
      } else {
        dense_mlp_to_hf(i, p);
      }
    }
    norm("decoder.final_layernorm", "model.norm");
    if (c.untie_embeddings_and_output_weights) {
      hf.insert("lm_head.weight", trim_rows(take(m, "output_layer.weight", {s.padded_vocab, s.hidden}, what), s.vocab));
    }
    return hf;
  }
  // GPT-2.
  hf.insert("transformer.wte.weight", trim_rows(embed, s.vocab));
  hf.insert("transformer.wpe.weight",
            compact(take(m, "embedding.position_embeddings.weight", {s.positions, s.hidden}, what)));
  for (std::int64_t i = 0; i < s.layers; ++i) {
    const std::string p = fmt::format("transformer.h.{}.", i);
    norm(layer(i, "input_layernorm"), p + "ln_1");
    auto w = split_qkv(take(m, layer(i, "self_attention.linear_qkv.weight"), {qkv_rows, s.hidden}, what), s);
    hf.insert(p + "attn.c_attn.weight", compact(concat_three(w.q, w.k, w.v).t()));
    auto b = split_qkv(take(m, layer(i, "self_attention.linear_qkv.bias"), {qkv_rows}, what), s);
    hf.insert(p + "attn.c_attn.bias", concat_three(b.q, b.k, b.v));
    hf.insert(p + "attn.c_proj.weight",
              compact(take(m, layer(i, "self_attention.linear_proj.weight"), {s.hidden, attn_width}, what).t()));
    hf.insert(p + "attn.c_proj.bias", compact(take(m, layer(i, "self_attention.linear_proj.bias"), {s.hidden}, what)));
    norm(layer(i, "pre_mlp_layernorm"), p + "ln_2");
    hf.insert(p + "mlp.c_fc.weight", compact(take(m, layer(i, "mlp.linear_fc1.weight"), {s.ffn, s.hidden}, what).t()));
    hf.insert(p + "mlp.c_fc.bias", compact(take(m, layer(i, "mlp.linear_fc1.bias"), {s.ffn}, what)));
    hf.insert(p + "mlp.c_proj.weight",
              compact(take(m, layer(i, "mlp.linear_fc2.weight"), {s.hidden, s.ffn}, what).t()));
    hf.insert(p + "mlp.c_proj.bias", compact(take(m, layer(i, "mlp.linear_fc2.bias"), {s.hidden}, what)));
  }
  norm("decoder.final_layernorm", "transformer.ln_f");
  if (c.untie_embeddings_and_output_weights) {
    hf.insert("lm_head.weight", trim_rows(take(m, "output_layer.weight", {s.padded_vocab, s.hidden}, what), s.vocab));
  }
  return hf;
}

namespace {}  // namespace

TensorDict hf_to_megatron(const GptConfig& c, const TensorDict& hf_dict, bool rope_interleave) {
  const auto arch = hf_architecture_for(c);
  const Sizes s = sizes_of(c);
  HfTensors hf(hf_dict, arch);
  // DeepSeek-V3 checkpoints may carry the MTP modules as layer num_hidden_layers (DeepSeek's
  // release does); transformers does not load them, nor does Kiln's import.
  if (arch == HfArchitecture::DeepseekV3) hf.ignore_prefix(fmt::format("model.layers.{}.", s.layers));
  const bool bias = c.add_bias_linear;
  const bool norm_bias = c.normalization == Normalization::LayerNorm;
  const std::int64_t attn_width = s.heads * s.head_dim;
  TensorDict m;
  auto norm = [&](const std::string& from, const std::string& name) {
    m.insert(name + ".weight", hf.take(from + ".weight", {s.hidden}));
    if (norm_bias) m.insert(name + ".bias", hf.take(from + ".bias", {s.hidden}));
  };
  // Llama's attention and dense MLP of layer i (HF prefix p); Mixtral shares the attention,
  // DeepSeek-V3 the dense MLP of its first layers.
  auto llama_attention_from_hf = [&](std::int64_t i, const std::string& p) {
    QkvParts w{hf.take(p + "self_attn.q_proj.weight", {attn_width, s.hidden}),
               hf.take(p + "self_attn.k_proj.weight", {s.groups * s.head_dim, s.hidden}),
               hf.take(p + "self_attn.v_proj.weight", {s.groups * s.head_dim, s.hidden})};
    m.insert(layer(i, "self_attention.linear_qkv.weight"), join_qkv(w, s));
    if (bias) {
      QkvParts b{hf.take(p + "self_attn.q_proj.bias", {attn_width}),
                 hf.take(p + "self_attn.k_proj.bias", {s.groups * s.head_dim}),
                 hf.take(p + "self_attn.v_proj.bias", {s.groups * s.head_dim})};
      m.insert(layer(i, "self_attention.linear_qkv.bias"), join_qkv(b, s));
    }
    m.insert(layer(i, "self_attention.linear_proj.weight"),
             hf.take(p + "self_attn.o_proj.weight", {s.hidden, attn_width}));
    if (bias) m.insert(layer(i, "self_attention.linear_proj.bias"), hf.take(p + "self_attn.o_proj.bias", {s.hidden}));
  };
  auto dense_mlp_from_hf = [&](std::int64_t i, const std::string& p) {
    m.insert(layer(i, "mlp.linear_fc1.weight"), stack_rows(hf.take(p + "mlp.gate_proj.weight", {s.ffn, s.hidden}),
                                                           hf.take(p + "mlp.up_proj.weight", {s.ffn, s.hidden})));
    if (bias) {
      m.insert(layer(i, "mlp.linear_fc1.bias"),
               stack_rows(hf.take(p + "mlp.gate_proj.bias", {s.ffn}), hf.take(p + "mlp.up_proj.bias", {s.ffn})));
    }
    m.insert(layer(i, "mlp.linear_fc2.weight"), hf.take(p + "mlp.down_proj.weight", {s.hidden, s.ffn}));
    if (bias) m.insert(layer(i, "mlp.linear_fc2.bias"), hf.take(p + "mlp.down_proj.bias", {s.hidden}));
  };
  const std::string embed_name = arch != HfArchitecture::Gpt2 ? "model.embed_tokens.weight" : "transformer.wte.weight";
  const Tensor embed = hf.take(embed_name, {s.vocab, s.hidden});
  m.insert("embedding.word_embeddings.weight", pad_rows(embed, s.padded_vocab));
  if (arch == HfArchitecture::Gpt2) {
    m.insert("embedding.position_embeddings.weight", hf.take("transformer.wpe.weight", {s.positions, s.hidden}));
  }
  for (std::int64_t i = 0; i < s.layers; ++i) {
    if (arch != HfArchitecture::Gpt2) {
      const std::string p = fmt::format("model.layers.{}.", i);
      norm(p + "input_layernorm", layer(i, "input_layernorm"));
      if (arch == HfArchitecture::DeepseekV3) {
        mla_from_hf(c, hf, i, p, rope_interleave, m);
      } else {
        llama_attention_from_hf(i, p);
      }
      norm(p + "post_attention_layernorm", layer(i, "pre_mlp_layernorm"));
      if (c.is_moe_layer(i)) {
        moe_from_hf(c, arch, hf, i, p, m);
      } else {
        dense_mlp_from_hf(i, p);
      }
    } else {
      const std::string p = fmt::format("transformer.h.{}.", i);
      norm(p + "ln_1", layer(i, "input_layernorm"));
      // c_attn [H, 3H]: its transpose's rows are all q heads, all k heads, all v heads.
      const Tensor w = compact(hf.take(p + "attn.c_attn.weight", {s.hidden, 3 * attn_width}).t());
      const Tensor b = hf.take(p + "attn.c_attn.bias", {3 * attn_width});
      auto part = [&](const Tensor& t, int k) { return compact(t.narrow(0, k * attn_width, attn_width)); };
      m.insert(layer(i, "self_attention.linear_qkv.weight"), join_qkv({part(w, 0), part(w, 1), part(w, 2)}, s));
      m.insert(layer(i, "self_attention.linear_qkv.bias"), join_qkv({part(b, 0), part(b, 1), part(b, 2)}, s));
      m.insert(layer(i, "self_attention.linear_proj.weight"),
               compact(hf.take(p + "attn.c_proj.weight", {attn_width, s.hidden}).t()));
      m.insert(layer(i, "self_attention.linear_proj.bias"), hf.take(p + "attn.c_proj.bias", {s.hidden}));
      norm(p + "ln_2", layer(i, "pre_mlp_layernorm"));
      m.insert(layer(i, "mlp.linear_fc1.weight"), compact(hf.take(p + "mlp.c_fc.weight", {s.hidden, s.ffn}).t()));
      m.insert(layer(i, "mlp.linear_fc1.bias"), hf.take(p + "mlp.c_fc.bias", {s.ffn}));
      m.insert(layer(i, "mlp.linear_fc2.weight"), compact(hf.take(p + "mlp.c_proj.weight", {s.ffn, s.hidden}).t()));
      m.insert(layer(i, "mlp.linear_fc2.bias"), hf.take(p + "mlp.c_proj.bias", {s.hidden}));
    }
  }
  norm(arch != HfArchitecture::Gpt2 ? "model.norm" : "transformer.ln_f", "decoder.final_layernorm");
  if (c.untie_embeddings_and_output_weights) {
    m.insert("output_layer.weight", pad_rows(hf.take("lm_head.weight", {s.vocab, s.hidden}), s.padded_vocab));
  } else if (hf.contains("lm_head.weight")) {
    // Tied models may still save the (shared) output matrix; it must be the embedding.
    const Tensor head = hf.take("lm_head.weight", {s.vocab, s.hidden});
    KILN_CHECK(head.to_vector<float>() == embed.to_vector<float>(),
               "import-hf: lm_head.weight differs from the token embedding, but config.json says "
               "tie_word_embeddings (set it to false to keep both)");
  }
  hf.check_all_used();
  return m;
}

// ---- directories ----

namespace {

void copy_file_to(const fs::path& from, const fs::path& to) {
  KILN_CHECK(fs::is_regular_file(from), "export-hf: the tokenizer file {} does not exist", from.string());
  io::AtomicFile out(to);
  out.write(data::read_text_file(from));
  out.commit();
}

// The tokenizer's files under their Hugging Face names.
void write_tokenizer_files(const fs::path& dir, const data::TokenizerSpec& spec, std::int64_t positions) {
  if (spec.type == "GPT2BPETokenizer") {
    fs::path vocab = spec.vocab_file, merges = spec.merge_file;
    if (vocab.empty() || merges.empty()) {
      for (auto [v, mg] : {std::pair{"vocab.json", "merges.txt"}, std::pair{"encoder.json", "vocab.bpe"}}) {
        if (fs::exists(spec.model / v) && fs::exists(spec.model / mg)) {
          vocab = spec.model / v;
          merges = spec.model / mg;
          break;
        }
      }
    }
    KILN_CHECK(!vocab.empty() && !merges.empty(),
               "export-hf: the checkpoint's GPT-2 tokenizer files are not found in {}", spec.model.string());
    // encoder.json / vocab.bpe are vocab.json / merges.txt under OpenAI's names.
    copy_file_to(vocab, dir / "vocab.json");
    copy_file_to(merges, dir / "merges.txt");
    {
      io::AtomicFile json_file(dir / "tokenizer.json");
      json_file.write(data::gpt2_tokenizer_json(vocab, merges));
      json_file.commit();
    }
    json config = {{"tokenizer_class", "GPT2Tokenizer"}, {"bos_token", "<|endoftext|>"},
                   {"eos_token", "<|endoftext|>"},       {"unk_token", "<|endoftext|>"},
                   {"add_prefix_space", false},          {"model_max_length", positions}};
    io::AtomicFile out(dir / "tokenizer_config.json");
    out.write(config.dump(2) + "\n");
    out.commit();
    return;
  }
  KILN_CHECK(spec.type == "HuggingFaceTokenizer", "export-hf: unknown tokenizer type '{}'", spec.type);
  const fs::path file = fs::is_directory(spec.model) ? spec.model / "tokenizer.json" : spec.model;
  copy_file_to(file, dir / "tokenizer.json");
  for (const char* extra : {"tokenizer_config.json", "special_tokens_map.json"}) {
    if (fs::exists(file.parent_path() / extra)) copy_file_to(file.parent_path() / extra, dir / extra);
  }
}

std::optional<std::int64_t> token_id(const data::BpeTokenizer& t, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto id = t.token_to_id(name)) return *id;
  }
  return std::nullopt;
}

}  // namespace

void write_hf_directory(const fs::path& out, const GptConfig& config, const TensorDict& megatron,
                        const data::TokenizerSpec& tokenizer_spec) {
  KILN_CHECK(!out.empty(), "export-hf: --out is empty");
  if (fs::exists(out)) {
    KILN_CHECK(fs::is_directory(out) && (fs::is_empty(out) || fs::exists(out / "config.json")),
               "export-hf: --out {} exists and is not an earlier export (no config.json); choose another directory",
               out.string());
  }
  const auto tokenizer = data::make_tokenizer(tokenizer_spec);
  KILN_CHECK(tokenizer->vocab_size() <= config.vocab_size,
             "export-hf: the tokenizer ({}) has {} tokens, more than the model's vocabulary of {}", tokenizer->source(),
             tokenizer->vocab_size(), config.vocab_size);
  config.validate();
  const GptConfig& resolved = config;
  const TensorDict hf = megatron_to_hf(resolved, megatron);
  const DType dtype = hf.begin()->second.dtype();
  const auto eos = tokenizer->eod();
  const auto bos = token_id(*tokenizer, {"<|begin_of_text|>", "<s>", "<|endoftext|>"});
  const std::int64_t positions = resolved.max_positions();

  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  fs::create_directories(parent);
  const fs::path temp = parent / fmt::format("{}.tmp.{}", out.filename().string(), ::getpid());
  fs::remove_all(temp);
  fs::create_directories(temp);
  try {
    {
      io::AtomicFile file(temp / "config.json");
      file.write(hf_config_json(resolved, bos, eos ? std::optional<std::int64_t>(*eos) : std::nullopt, dtype));
      file.commit();
    }
    io::save_safetensors((temp / "model.safetensors").string(), hf, {{"format", "pt"}});
    write_tokenizer_files(temp, tokenizer_spec, positions);
    if (fs::exists(out)) {
      const fs::path old = parent / fmt::format("{}.old.{}", out.filename().string(), ::getpid());
      fs::rename(out, old);
      fs::rename(temp, out);
      fs::remove_all(old);
    } else {
      fs::rename(temp, out);
    }
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(temp, ignored);
    throw;
  }
}

HfDirectory read_hf_directory(const fs::path& dir, std::int64_t seq_length) {
  KILN_CHECK(fs::is_directory(dir), "import-hf: --hf {} is not a directory", dir.string());
  const fs::path config_path = dir / "config.json";
  KILN_CHECK(fs::is_regular_file(config_path), "import-hf: {} has no config.json", dir.string());
  HfDirectory result;
  result.config = gpt_config_from_hf(data::read_text_file(config_path), config_path.string(), seq_length);

  TensorDict hf;
  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(single)) {
    hf = io::load_safetensors(single.string()).tensors;
  } else {
    KILN_CHECK(fs::exists(index), "import-hf: {} holds neither model.safetensors nor model.safetensors.index.json",
               dir.string());
    json j;
    try {
      j = json::parse(data::read_text_file(index));
    } catch (const json::exception& e) {
      KILN_FAIL("{}: not valid JSON ({})", index.string(), e.what());
    }
    KILN_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "{}: no weight_map", index.string());
    std::set<std::string> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
      KILN_CHECK(file.is_string(), "{}: weight_map['{}'] is not a file name", index.string(), name);
      shards.insert(file.get<std::string>());
    }
    for (const auto& shard : shards) {
      KILN_CHECK(shard.find('/') == std::string::npos, "{}: shard '{}' is not a file of the directory", index.string(),
                 shard);
      for (auto& [name, t] : io::load_safetensors((dir / shard).string()).tensors) hf.insert(name, t);
    }
  }
  result.megatron = hf_to_megatron(result.config, hf, hf_rope_interleave(data::read_text_file(config_path)));

  if (fs::exists(dir / "tokenizer.json")) {
    result.tokenizer = {"HuggingFaceTokenizer", dir / "tokenizer.json", {}, {}};
  } else if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) {
    result.tokenizer = {"GPT2BPETokenizer", dir, dir / "vocab.json", dir / "merges.txt"};
  } else {
    KILN_FAIL("import-hf: {} has no tokenizer (tokenizer.json, or vocab.json + merges.txt)", dir.string());
  }
  return result;
}

}  // namespace kiln::models
