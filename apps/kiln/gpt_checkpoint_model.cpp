#include "gpt_checkpoint_model.h"

#include <fmt/format.h>

#include <charconv>
#include <optional>

#include "kiln/runtime/error.h"
#include "kiln/train/gpt_checkpoint.h"
#include "kiln/train/gpt_pretrain.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

const std::string* find_flag(const FlagList& flags, std::string_view name) {
  for (const auto& [flag, value] : flags) {
    if (flag == name) return &value;
  }
  return nullptr;
}

struct FlagReader {
  const FlagList& flags;
  const std::string& where;

  std::optional<std::int64_t> integer(std::string_view name) const {
    const std::string* v = find_flag(flags, name);
    if (!v) return std::nullopt;
    std::int64_t out = 0;
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
    KILN_CHECK(ec == std::errc() && end == v->data() + v->size(), "{}: {} is '{}', not a whole number", where, name,
               *v);
    return out;
  }
  std::optional<double> number(std::string_view name) const {
    const std::string* v = find_flag(flags, name);
    if (!v) return std::nullopt;
    try {
      std::size_t used = 0;
      const double out = std::stod(*v, &used);
      if (used == v->size()) return out;
    } catch (const std::exception&) {
    }
    KILN_FAIL("{}: {} is '{}', not a number", where, name, *v);
  }
  // A recorded switch: "true"/"false" in shape flags; a flag given on the command line.
  bool flag(std::string_view name) const {
    const std::string* v = find_flag(flags, name);
    if (!v) return false;
    return !(*v == "false" || *v == "0");
  }
  const std::string* text(std::string_view name) const { return find_flag(flags, name); }
};

}  // namespace

FlagList checkpoint_shape_flags(const models::GptConfig& config, bool bf16) {
  FlagList f = train::gpt_shape_flags(config);
  f.emplace_back("--bf16", bf16 ? "true" : "false");  // as the trainer records it
  return f;
}

models::GptConfig gpt_config_from_checkpoint_flags(const FlagList& shape, const FlagList& all, const fs::path& base,
                                                   const std::string& where, bool* bf16) {
  const FlagReader s{shape, where};
  const FlagReader a{all, where};
  models::GptConfig c;
  auto required = [&](std::string_view name) {
    auto v = s.integer(name);
    KILN_CHECK(v.has_value(), "{}: the checkpoint does not record the model flag {}", where, name);
    return *v;
  };
  c.num_layers = required("--num-layers");
  c.hidden_size = required("--hidden-size");
  c.ffn_hidden_size = required("--ffn-hidden-size");
  c.num_attention_heads = required("--num-attention-heads");
  c.num_query_groups = required("--num-query-groups");
  c.kv_channels = required("--kv-channels");
  c.max_position_embeddings = required("--max-position-embeddings");
  c.seq_length = a.integer("--seq-length").value_or(c.max_position_embeddings);
  if (const auto* v = s.text("--position-embedding-type"))
    c.position_embedding_type = models::parse_position_embedding(*v);
  if (const auto* v = s.text("--normalization")) c.normalization = models::parse_normalization(*v);
  c.rotary_base = s.number("--rotary-base").value_or(c.rotary_base);
  c.rope_llama3_scaling = s.flag("--use-rope-scaling");
  c.rope_scaling_factor = a.number("--rope-scaling-factor").value_or(c.rope_scaling_factor);
  c.norm_epsilon = s.number("--norm-epsilon").value_or(c.norm_epsilon);
  c.swiglu = s.flag("--swiglu");
  c.add_bias_linear = !s.flag("--disable-bias-linear");
  c.untie_embeddings_and_output_weights = s.flag("--untie-embeddings-and-output-weights");
  if (auto experts = s.integer("--num-experts")) {  // MoE: the flags train::append_moe_shape_flags records
    c.num_experts = *experts;
    c.moe_ffn_hidden_size = required("--moe-ffn-hidden-size");
    c.moe_router_topk = required("--moe-router-topk");
    if (const auto* v = s.text("--moe-router-score-function"))
      c.moe_router_score_function = models::parse_moe_router_score(*v);
    c.moe_router_pre_softmax = s.flag("--moe-router-pre-softmax");
    c.moe_router_topk_scaling_factor = s.number("--moe-router-topk-scaling-factor").value_or(0);
    c.moe_router_enable_expert_bias = s.flag("--moe-router-enable-expert-bias");
    c.moe_router_num_groups = s.integer("--moe-router-num-groups").value_or(0);
    c.moe_router_group_topk = s.integer("--moe-router-group-topk").value_or(0);
    c.moe_shared_expert_intermediate_size = s.integer("--moe-shared-expert-intermediate-size").value_or(0);
    if (const auto* v = s.text("--moe-layer-freq")) models::parse_moe_layer_freq(*v, c);
    c.moe_grouped_gemm = c.moe_permute_fusion = true;  // inference: the fused path
  }
  if (s.flag("--multi-latent-attention")) {  // MLA: the recorded groups and kv-channels are the unused defaults
    c.multi_latent_attention = true;
    c.num_query_groups = 0;
    c.kv_channels = 0;
    c.q_lora_rank = required("--q-lora-rank");
    c.kv_lora_rank = required("--kv-lora-rank");
    c.qk_head_dim = required("--qk-head-dim");
    c.qk_pos_emb_head_dim = required("--qk-pos-emb-head-dim");
    c.v_head_dim = required("--v-head-dim");
  }
  c.mtp_num_layers = s.integer("--mtp-num-layers").value_or(0);  // MTP: its weights load; generation ignores them
  c.make_vocab_size_divisible_by = a.integer("--make-vocab-size-divisible-by").value_or(128);
  if (auto v = a.integer("--vocab-size")) {
    c.vocab_size = *v;
  } else {
    c.vocab_size = data::make_tokenizer(tokenizer_from_flags(all, base))->vocab_size();
  }
  // Generation and conversion run the model for inference: no dropout.
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  const bool is_bf16 = s.flag("--bf16");
  if (bf16) *bf16 = is_bf16;
  c.validate();
  // The rebuilt config must record exactly what the checkpoint records.
  const FlagList again = checkpoint_shape_flags(c, is_bf16);
  std::string diffs;
  for (const auto& [flag, value] : shape) {
    const std::string* mine = find_flag(again, flag);
    if (!mine || *mine != value) {
      diffs += fmt::format("\n  {}: {} in the checkpoint, {} rebuilt", flag, value, mine ? *mine : "not set");
    }
  }
  KILN_CHECK(diffs.empty(), "{}: the recorded flags do not rebuild the checkpoint's model (is its tokenizer there?):{}",
             where, diffs);
  return c;
}

data::TokenizerSpec tokenizer_from_flags(const FlagList& flags, const fs::path& base) {
  // The copy in <checkpoint>/tokenizer/ (pretrain-gpt and import-hf write one) comes first: the
  // recorded path may be relative to another working directory, or gone.
  auto path = [&](std::string_view name, const char* copied) -> fs::path {
    const std::string* v = find_flag(flags, name);
    if (!v || v->empty()) return {};
    if (fs::exists(base / "tokenizer" / copied)) return base / "tokenizer" / copied;
    const fs::path p(*v);
    if (p.is_relative() && fs::exists(base / p)) return base / p;
    return p;
  };
  const std::string* type = find_flag(flags, "--tokenizer-type");
  KILN_CHECK(type && !type->empty(),
             "the checkpoint does not record --tokenizer-type (it was trained with --vocab-size alone), so text "
             "cannot be encoded for it");
  data::TokenizerSpec spec;
  spec.type = *type;
  spec.model = path("--tokenizer-model", fs::is_directory(base / "tokenizer" / "model") ? "model" : "tokenizer.json");
  spec.vocab_file = path("--vocab-file", "vocab.json");
  spec.merge_file = path("--merge-file", "merges.txt");
  return spec;
}

FlagList tokenizer_flags(const data::TokenizerSpec& spec) {
  FlagList f{{"--tokenizer-type", spec.type}};
  if (!spec.model.empty()) f.emplace_back("--tokenizer-model", spec.model.string());
  if (!spec.vocab_file.empty()) f.emplace_back("--vocab-file", spec.vocab_file.string());
  if (!spec.merge_file.empty()) f.emplace_back("--merge-file", spec.merge_file.string());
  return f;
}

CheckpointModel read_checkpoint_model(const fs::path& load) {
  KILN_CHECK(fs::is_directory(load), "--load {}: no such directory (give the --save directory of pretrain-gpt)",
             load.string());
  KILN_CHECK(train::latest_checkpoint_iteration(load).has_value(),
             "--load {}: holds no pretrain-gpt checkpoint (no latest_checkpointed_iteration.txt)", load.string());
  auto weights = train::read_gpt_checkpoint_weights(load);
  const std::string where = fmt::format("--load {}", load.string());
  CheckpointModel out;
  out.config = gpt_config_from_checkpoint_flags(weights.shape_flags, weights.all_flags, load, where, &out.bf16);
  // The vocabulary size must come from the tokenizer the text is encoded with.
  if (!find_flag(weights.all_flags, "--vocab-size") || find_flag(weights.all_flags, "--tokenizer-type")) {
    out.tokenizer = tokenizer_from_flags(weights.all_flags, load);
  }
  out.weights = std::move(weights.model);
  out.iteration = weights.iteration;
  return out;
}

}  // namespace kiln::cli
