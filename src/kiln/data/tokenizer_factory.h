#pragma once
// Tokenizers by Megatron's type names, so that Kiln's flags read like Megatron's:
//   GPT2BPETokenizer      --vocab-file vocab.json --merge-file merges.txt (or --tokenizer-model DIR
//                         holding vocab.json + merges.txt, or encoder.json + vocab.bpe)
//   HuggingFaceTokenizer  --tokenizer-model tokenizer.json (or the directory holding it)
#include <filesystem>
#include <memory>
#include <string>

#include "kiln/data/bpe_tokenizer.h"

namespace kiln::data {

struct TokenizerSpec {
  std::string type;
  std::filesystem::path model;
  std::filesystem::path vocab_file;
  std::filesystem::path merge_file;
};

// Throws kiln::Error for an unknown type (listing the known ones) or missing files.
std::shared_ptr<const BpeTokenizer> make_tokenizer(const TokenizerSpec& spec);

}  // namespace kiln::data
