// read_gpt2_bpe_files on an arbitrary vocab.json and, after a NUL byte, merges.txt. It reads, or
// refuses with a kiln::Error naming the file at fault; what it reads builds a tokenizer that
// encodes text (tokenizer_sample.h).
#include "fuzz_support.h"
#include "kiln/data/tokenizer_files.h"
#include "tokenizer_sample.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path vocab = kiln::fuzz::scratch_path("vocab.json");
  static const std::filesystem::path merges = kiln::fuzz::scratch_path("merges.txt");
  auto [vocab_text, merges_text] = kiln::fuzz::split_at_nul(data, size);
  kiln::fuzz::write_file(vocab, vocab_text);
  kiln::fuzz::write_file(merges, merges_text);
  kiln::data::BpeDefinition def;
  // The message names vocab.json or merges.txt; both live in the scratch folder.
  if (!kiln::fuzz::parses(kiln::fuzz::scratch_dir().string(),
                          [&] { def = kiln::data::read_gpt2_bpe_files(vocab, merges); }))
    return 0;
  kiln::fuzz::exercise_tokenizer(std::move(def), kiln::fuzz::scratch_dir().string());
  return 0;
}
