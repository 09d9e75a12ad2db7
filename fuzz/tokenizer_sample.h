#pragma once
// Text the tokenizer harnesses encode with whatever tokenizer a fuzzed file defines: ASCII,
// digits, whitespace runs, multi-byte UTF-8, invalid UTF-8, and the usual special tokens.
#include <optional>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "kiln/data/bpe_tokenizer.h"

namespace kiln::fuzz {

inline constexpr std::string_view kTokenizerSample =
    "Hello, world! It's 2026: 12345 tokens.\n\n  \t indented\r\ncaf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac "
    "\xf0\x9f\x94\xa5 \xff\xfe bad bytes <|endoftext|> <|begin_of_text|></s><eos>";

// Builds the tokenizer a definition describes and runs it over the sample. Building may refuse
// the definition (naming `name`); once built, encoding and decoding must not fail.
inline void exercise_tokenizer(data::BpeDefinition def, std::string_view name) {
  std::optional<data::BpeTokenizer> tokenizer;
  if (!parses(name, [&] { tokenizer.emplace(std::move(def)); })) return;
  std::vector<std::int32_t> ids;
  if (!parses(name, [&] { ids = tokenizer->encode(kTokenizerSample); })) return;
  for (std::int32_t id : ids) {
    if (id < 0 || id >= tokenizer->vocab_size()) fail("an encoded id is outside the vocabulary");
  }
  tokenizer->decode(ids);
}

}  // namespace kiln::fuzz
