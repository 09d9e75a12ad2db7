#include "kiln/data/tokenizer_factory.h"

#include "kiln/data/tokenizer_files.h"
#include "kiln/runtime/error.h"

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

std::shared_ptr<const BpeTokenizer> make_gpt2(const TokenizerSpec& spec) {
  fs::path vocab = spec.vocab_file;
  fs::path merges = spec.merge_file;
  if (vocab.empty() && merges.empty() && !spec.model.empty()) {
    KILN_CHECK(fs::is_directory(spec.model),
               "GPT2BPETokenizer: --tokenizer-model {} is not a directory (give --vocab-file and --merge-file)",
               spec.model.string());
    for (auto [v, m] : {std::pair{"vocab.json", "merges.txt"}, std::pair{"encoder.json", "vocab.bpe"}}) {
      if (fs::exists(spec.model / v) && fs::exists(spec.model / m)) {
        vocab = spec.model / v;
        merges = spec.model / m;
        break;
      }
    }
    KILN_CHECK(!vocab.empty(),
               "GPT2BPETokenizer: {} holds neither vocab.json + merges.txt nor encoder.json + vocab.bpe",
               spec.model.string());
  }
  KILN_CHECK(!vocab.empty() && !merges.empty(), "GPT2BPETokenizer needs --vocab-file and --merge-file");
  return std::make_shared<const BpeTokenizer>(read_gpt2_bpe_files(vocab, merges));
}

}  // namespace

std::shared_ptr<const BpeTokenizer> make_tokenizer(const TokenizerSpec& spec) {
  if (spec.type == "GPT2BPETokenizer") return make_gpt2(spec);
  if (spec.type == "HuggingFaceTokenizer") {
    KILN_CHECK(!spec.model.empty(), "HuggingFaceTokenizer needs --tokenizer-model (a tokenizer.json or its directory)");
    return std::make_shared<const BpeTokenizer>(read_hugging_face_tokenizer(spec.model));
  }
  KILN_FAIL("unknown tokenizer type '{}' (known: GPT2BPETokenizer, HuggingFaceTokenizer)", spec.type);
}

}  // namespace kiln::data
