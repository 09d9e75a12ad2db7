#include "kiln/data/tokenizer_files.h"

#include <fmt/format.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/data/byte_level.h"
#include "kiln/runtime/error.h"

namespace kiln::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "cannot open {}: {}", path.string(), std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  KILN_CHECK(!in.bad(), "cannot read {}", path.string());
  return std::move(buffer).str();
}

namespace {

json parse_json_file(const fs::path& path) {
  std::string text = read_text_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    KILN_FAIL("{} is not valid JSON: {}", path.string(), e.what());
  }
}

std::string token_bytes(const std::string& spelled, const std::string& source) {
  auto bytes = byte_level_to_bytes(spelled);
  KILN_CHECK(bytes.has_value(), "{}: token '{}' has a character outside GPT-2's byte-level alphabet", source, spelled);
  return std::move(*bytes);
}

// A token id from the file: ids are int32 (Megatron's and Kiln's), so a larger one is refused here
// rather than cut to its low 32 bits (which would alias another token).
std::int32_t token_id(const json& id, const std::string& what, const std::string& source) {
  KILN_CHECK(id.is_number_integer(), "{}: {} has id {}, which is not an integer", source, what, id.dump());
  if (id.is_number_unsigned()) {
    auto value = id.get<std::uint64_t>();
    KILN_CHECK(value <= static_cast<std::uint64_t>(INT32_MAX),
               "{}: {} has id {}, which does not fit int32, the token id type (at most {})", source, what, value,
               INT32_MAX);
    return static_cast<std::int32_t>(value);
  }
  auto value = id.get<std::int64_t>();
  KILN_CHECK(value >= 0 && value <= INT32_MAX, "{}: {} has id {}, outside int32's [0, {}], the token id type", source,
             what, value, INT32_MAX);
  return static_cast<std::int32_t>(value);
}

std::vector<std::pair<std::string, std::int32_t>> read_vocab(const json& vocab, const std::string& source) {
  KILN_CHECK(vocab.is_object(), "{}: the vocabulary is not a JSON object of token -> id", source);
  std::vector<std::pair<std::string, std::int32_t>> out;
  out.reserve(vocab.size());
  for (const auto& [spelled, id] : vocab.items()) {
    KILN_CHECK(id.is_number_integer(), "{}: token '{}' has a non-integer id {}", source, spelled, id.dump());
    out.emplace_back(token_bytes(spelled, source), token_id(id, fmt::format("token '{}'", spelled), source));
  }
  return out;
}

std::pair<std::string, std::string> split_merge(std::string_view line, const std::string& source, std::size_t number) {
  auto space = line.find(' ');
  KILN_CHECK(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                 line.find(' ', space + 1) == std::string_view::npos,
             "{}: merge {} ('{}') is not two tokens separated by one space", source, number, line);
  return {token_bytes(std::string(line.substr(0, space)), source),
          token_bytes(std::string(line.substr(space + 1)), source)};
}

// tokenizer_config.json's eos_token: a string, or {"content": ...}; null or absent: none named.
std::optional<std::string> configured_eos(const fs::path& config_path) {
  if (!fs::exists(config_path)) return std::nullopt;
  json config = parse_json_file(config_path);
  KILN_CHECK(config.is_object(), "{}: not a JSON object", config_path.string());
  if (!config.contains("eos_token") || config["eos_token"].is_null()) return std::nullopt;
  const json& eos = config["eos_token"];
  if (eos.is_string()) return eos.get<std::string>();
  KILN_CHECK(eos.is_object() && eos.contains("content") && eos["content"].is_string(),
             "{}: eos_token is {}, neither a string nor {{\"content\": string}}", config_path.string(), eos.dump());
  return eos["content"].get<std::string>();
}

void configure_pre_tokenizer(const json& pre, BpeDefinition& def, const std::string& source) {
  KILN_CHECK(pre.is_object() && pre.contains("type"), "{}: pre_tokenizer has no type", source);
  std::string type = pre["type"].get<std::string>();
  if (type == "Sequence") {
    bool have_pattern = false;
    // operator[] of a const json on a missing key is undefined behaviour, not an exception.
    KILN_CHECK(pre.contains("pretokenizers") && pre["pretokenizers"].is_array(),
               "{}: pre_tokenizer Sequence has no pretokenizers array", source);
    for (const auto& step : pre["pretokenizers"]) {
      std::string step_type = step.value("type", "");
      if (step_type == "Split") {
        KILN_CHECK(!have_pattern, "{}: pre_tokenizer: only one Split step is supported", source);
        KILN_CHECK(step.contains("pattern") && step["pattern"].contains("Regex"),
                   "{}: pre_tokenizer Split: only a Regex pattern is supported", source);
        KILN_CHECK(step.value("behavior", "") == "Isolated" && !step.value("invert", false),
                   "{}: pre_tokenizer Split: only behavior Isolated without invert is supported", source);
        def.pattern = step["pattern"]["Regex"].get<std::string>();
        have_pattern = true;
      } else if (step_type == "ByteLevel") {
        KILN_CHECK(!step.value("use_regex", true) || !have_pattern,
                   "{}: pre_tokenizer: a ByteLevel step with use_regex after a Split is not supported", source);
        def.add_prefix_space = step.value("add_prefix_space", false);
        if (step.value("use_regex", true)) {
          def.pattern = Pretokenizer::kGpt2Pattern;
          have_pattern = true;
        }
      } else {
        KILN_FAIL("{}: pre_tokenizer step '{}' is not supported (Split and ByteLevel are)", source, step_type);
      }
    }
    KILN_CHECK(have_pattern, "{}: pre_tokenizer has no regex (Split or ByteLevel with use_regex)", source);
  } else if (type == "ByteLevel") {
    def.add_prefix_space = pre.value("add_prefix_space", false);
    KILN_CHECK(pre.value("use_regex", true), "{}: a ByteLevel pre_tokenizer without use_regex is not supported",
               source);
    def.pattern = Pretokenizer::kGpt2Pattern;
  } else {
    KILN_FAIL("{}: pre_tokenizer '{}' is not supported (byte-level BPE: Sequence, Split, ByteLevel)", source, type);
  }
}

BpeDefinition gpt2_definition(const fs::path& vocab_json, const fs::path& merges_txt) {
  BpeDefinition def;
  def.source = vocab_json.string() + " + " + merges_txt.string();
  def.vocab = read_vocab(parse_json_file(vocab_json), vocab_json.string());
  std::string merges = read_text_file(merges_txt);
  std::size_t number = 0;
  for (std::size_t pos = 0; pos < merges.size();) {
    std::size_t end = merges.find('\n', pos);
    if (end == std::string::npos) end = merges.size();
    std::string_view line(merges.data() + pos, end - pos);
    pos = end + 1;
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (number == 1 && line.starts_with("#version"))) continue;
    def.merges.push_back(split_merge(line, merges_txt.string(), number));
  }
  def.split_added_tokens = false;
  def.ignore_merges = false;
  def.pattern = Pretokenizer::kGpt2Pattern;
  for (const auto& [bytes, id] : def.vocab) {
    if (bytes == "<|endoftext|>") {
      def.eod = id;
      def.added_tokens.push_back({bytes, id, true});
    }
  }
  KILN_CHECK(def.eod.has_value(), "{}: no '<|endoftext|>' token (the end-of-document token of GPT-2)",
             vocab_json.string());
  return def;
}

BpeDefinition hugging_face_definition(const fs::path& path) {
  std::string source = path.string();
  json root = parse_json_file(path);
  BpeDefinition def;
  def.source = source;
  KILN_CHECK(root.contains("model") && root["model"].is_object(), "{}: no 'model' object", source);
  const json& model = root["model"];
  KILN_CHECK(model.value("type", "BPE") == "BPE", "{}: model type '{}' is not supported (only BPE)", source,
             model.value("type", ""));
  KILN_CHECK(!model.value("byte_fallback", false), "{}: BPE with byte_fallback (SentencePiece style) is not supported",
             source);
  // Hugging Face's own GPT-2 file spells "none" as "" for these two, other files as null: both mean no affix.
  const auto no_affix = [&](const char* key) {
    const json value = model.value(key, json());
    return value.is_null() || (value.is_string() && value.get<std::string>().empty());
  };
  KILN_CHECK(no_affix("continuing_subword_prefix") && no_affix("end_of_word_suffix"),
             "{}: BPE with continuing_subword_prefix / end_of_word_suffix is not supported", source);
  KILN_CHECK(!root.contains("normalizer") || root["normalizer"].is_null(),
             "{}: normalizer '{}' is not supported (byte-level BPE has none)", source,
             root.contains("normalizer") ? root["normalizer"].dump() : "");
  KILN_CHECK(!root.contains("decoder") || root["decoder"].is_null() || root["decoder"].value("type", "") == "ByteLevel",
             "{}: decoder '{}' is not supported (only ByteLevel)", source, root["decoder"].dump());
  KILN_CHECK(model.contains("vocab"), "{}: model has no vocab", source);
  def.vocab = read_vocab(model["vocab"], source + " model.vocab");
  def.ignore_merges = model.value("ignore_merges", false);
  KILN_CHECK(model.contains("merges") && model["merges"].is_array(), "{}: model.merges is not an array", source);
  std::size_t number = 0;
  for (const auto& merge : model["merges"]) {
    ++number;
    if (merge.is_string()) {
      def.merges.push_back(split_merge(merge.get<std::string>(), source + " model.merges", number));
    } else {
      // Newer files write each merge as ["a", "b"].
      KILN_CHECK(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
                 "{}: model.merges[{}] is neither \"a b\" nor [\"a\", \"b\"]", source, number - 1);
      def.merges.emplace_back(token_bytes(merge[0].get<std::string>(), source),
                              token_bytes(merge[1].get<std::string>(), source));
    }
  }
  KILN_CHECK(root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null(),
             "{}: no pre_tokenizer (byte-level BPE needs one)", source);
  configure_pre_tokenizer(root["pre_tokenizer"], def, source);

  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    KILN_CHECK(root["added_tokens"].is_array(), "{}: added_tokens is not an array", source);
    std::size_t index = 0;
    for (const auto& added : root["added_tokens"]) {
      KILN_CHECK(added.is_object() && added.contains("content") && added["content"].is_string() && added.contains("id"),
                 "{}: added_tokens[{}] is not an object with a string \"content\" and an \"id\": {}", source, index,
                 added.dump());
      std::string content = added["content"].get<std::string>();
      KILN_CHECK(!added.value("lstrip", false) && !added.value("rstrip", false) && !added.value("single_word", false),
                 "{}: added token '{}' uses lstrip/rstrip/single_word, which Kiln does not implement", source, content);
      def.added_tokens.push_back({content, token_id(added["id"], fmt::format("added token '{}'", content), source),
                                  added.value("special", false)});
      ++index;
    }
  }
  def.split_added_tokens = true;

  // Megatron's HuggingFaceTokenizer ends documents with the tokenizer's eos token. The one
  // tokenizer_config.json names must exist: ending documents with another token would be silently
  // wrong. The usual names are tried only when no config names one.
  const fs::path config_path = path.parent_path() / "tokenizer_config.json";
  auto eos = configured_eos(config_path);
  auto find_token = [&](const std::string& name) -> std::optional<std::int32_t> {
    for (const auto& added : def.added_tokens) {
      if (added.content == name) return added.id;
    }
    for (const auto& [bytes, id] : def.vocab) {
      if (bytes == name) return id;
    }
    return std::nullopt;
  };
  if (eos) {
    def.eod = find_token(*eos);
    KILN_CHECK(def.eod.has_value(),
               "{}: eos_token '{}' is not a token of {} (neither an added token nor in the vocabulary)",
               config_path.string(), *eos, source);
    return def;
  }
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"}) {
    def.eod = find_token(name);
    if (def.eod) break;
  }
  return def;
}

}  // namespace

// nlohmann's own errors ("type must be string, but is number") do not say which file: every one
// that the checks above did not anticipate leaves here with the file's name.
BpeDefinition read_gpt2_bpe_files(const fs::path& vocab_json, const fs::path& merges_txt) {
  try {
    return gpt2_definition(vocab_json, merges_txt);
  } catch (const json::exception& e) {
    KILN_FAIL("{} / {}: unexpected content: {}", vocab_json.string(), merges_txt.string(), e.what());
  }
}

BpeDefinition read_hugging_face_tokenizer(const fs::path& given) {
  fs::path path = fs::is_directory(given) ? given / "tokenizer.json" : given;
  try {
    return hugging_face_definition(path);
  } catch (const json::exception& e) {
    KILN_FAIL("{}: unexpected content (a field is missing or has the wrong type): {}", path.string(), e.what());
  }
}

}  // namespace kiln::data
