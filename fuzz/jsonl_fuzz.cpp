// preprocess_data on an arbitrary input file, as `kiln preprocess-data` reads it. The first byte
// picks the options (JSONL / text lines / whole text files, one or two --json-keys, --skip-bad,
// --append-eod, one or two workers); the rest is the file. It writes datasets that read back with
// the documents and tokens it reports, or refuses with a kiln::Error naming the input file.
#include "fuzz_support.h"
#include "kiln/data/indexed_dataset.h"
#include "kiln/data/preprocess.h"

namespace {

// Byte-level BPE over the 256 bytes with a few merges and an end-of-document token.
const kiln::data::BpeTokenizer& tokenizer() {
  static const kiln::data::BpeTokenizer t = [] {
    kiln::data::BpeDefinition def;
    def.source = "the fuzz harness's tokenizer";
    for (int b = 0; b < 256; ++b) def.vocab.emplace_back(std::string(1, static_cast<char>(b)), b);
    def.vocab.emplace_back("th", 256);
    def.vocab.emplace_back("the", 257);
    def.vocab.emplace_back(" t", 258);
    def.merges = {{"t", "h"}, {"th", "e"}, {" ", "t"}};
    def.added_tokens.push_back({"<|endoftext|>", 259, true});
    def.eod = 259;
    return kiln::data::BpeTokenizer(std::move(def));
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t flags = data[0];
  namespace kd = kiln::data;
  kd::PreprocessOptions options;
  const int format = flags & 3;  // 0, 3: JSONL; 1: text lines; 2: whole text file
  const bool jsonl = format == 0 || format == 3;
  if (format == 1) options.text_documents = kd::TextDocuments::Line;
  if (jsonl && (flags & 4)) options.json_keys = {"text", "title"};
  options.skip_bad = flags & 8;
  options.append_eod = flags & 16;
  options.workers = (flags & 32) ? 2 : 1;
  const std::filesystem::path input = kiln::fuzz::scratch_path(jsonl ? "input.jsonl" : "input.txt");
  kiln::fuzz::write_file(input, {data + 1, size - 1});
  options.inputs = {input};
  options.output_prefix = kiln::fuzz::scratch_path("out");

  kd::PreprocessResult result;
  if (!kiln::fuzz::parses(input.string(), [&] { result = kd::preprocess_data(tokenizer(), options); })) return 0;
  if (result.outputs.size() != (jsonl ? options.json_keys.size() : 1))
    kiln::fuzz::fail("preprocess-data: one output per key was not written");
  for (const auto& out : result.outputs) {
    kd::IndexedDataset ds(out.prefix);
    if (ds.document_count() != out.documents || ds.token_count() != out.tokens)
      kiln::fuzz::fail("preprocess-data: " + out.prefix.string() + " does not hold the documents and tokens reported");
  }
  if (!options.skip_bad && result.skipped != 0) kiln::fuzz::fail("preprocess-data skipped lines without --skip-bad");
  return 0;
}
