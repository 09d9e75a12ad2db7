// read_hugging_face_tokenizer on an arbitrary tokenizer.json and, after a NUL byte, an optional
// tokenizer_config.json beside it. It reads, or refuses with a kiln::Error naming the file; what it
// reads builds a tokenizer that encodes text (tokenizer_sample.h).
#include "fuzz_support.h"
#include "kiln/data/tokenizer_files.h"
#include "tokenizer_sample.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path json = kiln::fuzz::scratch_path("tokenizer.json");
  static const std::filesystem::path config = kiln::fuzz::scratch_path("tokenizer_config.json");
  auto [tokenizer_text, config_text] = kiln::fuzz::split_at_nul(data, size);
  kiln::fuzz::write_file(json, tokenizer_text);
  if (config_text.empty()) {
    std::filesystem::remove(config);
  } else {
    kiln::fuzz::write_file(config, config_text);
  }
  kiln::data::BpeDefinition def;
  // Errors name tokenizer.json or, for its eos token, tokenizer_config.json: both end in ".json".
  if (!kiln::fuzz::parses(".json", [&] { def = kiln::data::read_hugging_face_tokenizer(kiln::fuzz::scratch_dir()); }))
    return 0;
  kiln::fuzz::exercise_tokenizer(std::move(def), "tokenizer.json");
  return 0;
}
