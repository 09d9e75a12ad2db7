#include "kiln/data/gpt2_tokenizer_json.h"

#include <nlohmann/json.hpp>
#include <string_view>

#include "kiln/data/tokenizer_files.h"
#include "kiln/runtime/error.h"

namespace kiln::data {

namespace fs = std::filesystem;
using nlohmann::json;

std::string gpt2_tokenizer_json(const fs::path& vocab_json, const fs::path& merges_txt) {
  json vocab;
  try {
    vocab = json::parse(read_text_file(vocab_json));
  } catch (const json::exception& e) {
    KILN_FAIL("{}: not JSON: {}", vocab_json.string(), e.what());
  }
  KILN_CHECK(vocab.is_object(), "{}: not a JSON object of token -> id", vocab_json.string());
  // merges.txt: an optional "#version" first line, then one "left right" pair per line in rank order.
  json merges = json::array();
  const std::string text = read_text_file(merges_txt);
  std::size_t number = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (number == 1 && line.starts_with("#version"))) continue;
    const std::size_t space = line.find(' ');
    KILN_CHECK(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                   line.find(' ', space + 1) == std::string_view::npos,
               "{}: line {} is not a merge 'left right': '{}'", merges_txt.string(), number, line);
    merges.push_back(std::string(line));
  }
  const json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  json added = json::array();
  if (auto it = vocab.find("<|endoftext|>"); it != vocab.end()) {
    KILN_CHECK(it->is_number_integer(), "{}: the id of <|endoftext|> is not an integer", vocab_json.string());
    added.push_back({{"id", it->get<std::int64_t>()},
                     {"content", "<|endoftext|>"},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", true},
                     {"special", true}});
  }
  json post = byte_level;
  post["trim_offsets"] = false;
  const json root = {{"version", "1.0"},
                     {"truncation", nullptr},
                     {"padding", nullptr},
                     {"added_tokens", added},
                     {"normalizer", nullptr},
                     {"pre_tokenizer", byte_level},
                     {"post_processor", post},
                     {"decoder", byte_level},
                     {"model",
                      {{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", nullptr},
                       {"continuing_subword_prefix", ""},
                       {"end_of_word_suffix", ""},
                       {"fuse_unk", false},
                       {"byte_fallback", false},
                       {"vocab", vocab},
                       {"merges", merges}}}};
  return root.dump(2) + "\n";
}

}  // namespace kiln::data
