#pragma once
// The tokenizer flags preprocess-data and inspect-data share, spelled as Megatron spells them.
#include <CLI/CLI.hpp>
#include <string>

#include "kiln/data/tokenizer_factory.h"

namespace kiln::cli {

struct TokenizerFlags {
  std::string type;
  std::string model;
  std::string vocab_file;
  std::string merge_file;

  void add_to(CLI::App* cmd, bool required) {
    auto* t = cmd->add_option("--tokenizer-type", type, "GPT2BPETokenizer or HuggingFaceTokenizer")
                  ->check(CLI::IsMember({"GPT2BPETokenizer", "HuggingFaceTokenizer"}));
    if (required) t->required();
    cmd->add_option("--tokenizer-model", model,
                    "tokenizer.json (or its directory); for GPT-2 a directory of its files");
    cmd->add_option("--vocab-file", vocab_file, "GPT-2 vocab.json (encoder.json)");
    cmd->add_option("--merge-file", merge_file, "GPT-2 merges.txt (vocab.bpe)");
  }

  data::TokenizerSpec spec() const { return {type, model, vocab_file, merge_file}; }
};

}  // namespace kiln::cli
