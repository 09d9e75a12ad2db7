#include "gpt_checkpoint_model.h"

#include <fmt/format.h>

#include <charconv>
#include <optional>

#include "kiln/runtime/error.h"
#include "kiln/train/gpt_checkpoint.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

const std::string* find_flag(const FlagList& flags, std::string_view name) {
  for (const auto& [flag, value] : flags) {
    if (flag == name) return &value;
  }
  return nullptr;
}

std::string format_number(double v) { return fmt::format("{}", v); }

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
  bool flag(std::string_view name) const {
    const std::string* v = find_flag(flags, name);
    if (!v) return false;
    if (*v == "true" || *v == "1" || v->empty()) return true;
    if (*v == "false" || *v == "0") return false;
    KILN_FAIL("{}: {} is '{}', neither true nor false", where, name, *v);
  }
  const std::string* text(std::string_view name) const { return find_flag(flags, name); }
};

}  // namespace

FlagList gpt_shape_flags(const models::GptConfig& c, bool bf16) {
  FlagList f{
      {"--num-layers", std::to_string(c.num_layers)},
      {"--hidden-size", std::to_string(c.hidden_size)},
      {"--ffn-hidden-size", std::to_string(c.ffn_hidden())},
      {"--num-attention-heads", std::to_string(c.num_attention_heads)},
      {"--group-query-attention", c.query_groups() != c.num_attention_heads ? "true" : "false"},
      {"--num-query-groups", std::to_string(c.query_groups())},
      {"--kv-channels", std::to_string(c.head_dim())},
      {"--seq-length", std::to_string(c.seq_length)},
      {"--max-position-embeddings", std::to_string(c.max_positions())},
      {"--vocab-size", std::to_string(c.vocab_size)},
      {"--make-vocab-size-divisible-by", std::to_string(c.make_vocab_size_divisible_by)},
      {"--position-embedding-type", std::string(models::to_string(c.position_embedding_type))},
      {"--rotary-base", format_number(c.rotary_base)},
      {"--use-rope-scaling", c.rope_llama3_scaling ? "true" : "false"},
      {"--rope-scaling-factor", format_number(c.rope_scaling_factor)},
      {"--normalization", std::string(models::to_string(c.normalization))},
      {"--norm-epsilon", format_number(c.norm_epsilon)},
      {"--swiglu", c.swiglu ? "true" : "false"},
      {"--disable-bias-linear", c.add_bias_linear ? "false" : "true"},
      {"--untie-embeddings-and-output-weights", c.untie_embeddings_and_output_weights ? "true" : "false"},
      {"--bf16", bf16 ? "true" : "false"},
  };
  return f;
}

models::GptConfig gpt_config_from_shape_flags(const FlagList& flags, const std::string& where, bool* bf16) {
  const FlagReader r{flags, where};
  models::GptConfig c;
  auto required = [&](std::string_view name) {
    auto v = r.integer(name);
    KILN_CHECK(v.has_value(), "{}: the model flag {} is not recorded", where, name);
    return *v;
  };
  c.num_layers = required("--num-layers");
  c.hidden_size = required("--hidden-size");
  c.num_attention_heads = required("--num-attention-heads");
  c.seq_length = required("--seq-length");
  c.ffn_hidden_size = r.integer("--ffn-hidden-size").value_or(0);
  if (r.flag("--group-query-attention") || find_flag(flags, "--num-query-groups")) {
    c.num_query_groups = r.integer("--num-query-groups").value_or(0);
  }
  c.kv_channels = r.integer("--kv-channels").value_or(0);
  c.max_position_embeddings = r.integer("--max-position-embeddings").value_or(0);
  c.vocab_size = r.integer("--vocab-size").value_or(0);
  c.make_vocab_size_divisible_by = r.integer("--make-vocab-size-divisible-by").value_or(128);
  if (const auto* v = r.text("--position-embedding-type"))
    c.position_embedding_type = models::parse_position_embedding(*v);
  c.rotary_base = r.number("--rotary-base").value_or(10000);
  c.rope_llama3_scaling = r.flag("--use-rope-scaling");
  c.rope_scaling_factor = r.number("--rope-scaling-factor").value_or(8);
  if (const auto* v = r.text("--normalization")) c.normalization = models::parse_normalization(*v);
  c.norm_epsilon = r.number("--norm-epsilon").value_or(1e-5);
  c.swiglu = r.flag("--swiglu");
  c.add_bias_linear = !r.flag("--disable-bias-linear");
  c.untie_embeddings_and_output_weights = r.flag("--untie-embeddings-and-output-weights");
  // Generation and conversion run the model for inference: no dropout.
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  if (bf16) *bf16 = r.flag("--bf16");
  return c;
}

data::TokenizerSpec tokenizer_from_flags(const FlagList& flags, const fs::path& base) {
  auto path = [&](std::string_view name) -> fs::path {
    const std::string* v = find_flag(flags, name);
    if (!v || v->empty()) return {};
    const fs::path p(*v);
    if (p.is_relative() && fs::exists(base / p)) return base / p;
    return p;
  };
  data::TokenizerSpec spec;
  const std::string* type = find_flag(flags, "--tokenizer-type");
  KILN_CHECK(type && !type->empty(), "the checkpoint does not record --tokenizer-type, so its text cannot be encoded");
  spec.type = *type;
  spec.model = path("--tokenizer-model");
  spec.vocab_file = path("--vocab-file");
  spec.merge_file = path("--merge-file");
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
  out.config = gpt_config_from_shape_flags(weights.shape_flags, where, &out.bf16);
  out.tokenizer = tokenizer_from_flags(weights.all_flags, load);
  if (out.config.vocab_size == 0) {
    out.config.vocab_size = data::make_tokenizer(out.tokenizer)->vocab_size();
  }
  out.config.validate();
  out.weights = std::move(weights.model);
  out.iteration = weights.iteration;
  return out;
}

}  // namespace kiln::cli
