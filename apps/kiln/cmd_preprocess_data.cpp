// `kiln preprocess-data`: Megatron's tools/preprocess_data.py. Tokenizes JSONL or plain text into
// <output-prefix>_<key>_document.bin/.idx, prints the tokens per input and a --data-path line.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "commands.h"
#include "kiln/data/preprocess.h"
#include "tokenizer_flags.h"

namespace kiln::cli {

namespace {

// One line on stderr, redrawn at most five times a second, when stderr is a terminal.
class ProgressBar {
 public:
  ProgressBar() : enabled_(::isatty(STDERR_FILENO) != 0) {}

  void update(const data::PreprocessProgress& p, bool last = false) {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    if (!last && now - drawn_ < std::chrono::milliseconds(200)) return;
    drawn_ = now;
    double fraction = p.bytes_total > 0 ? static_cast<double>(p.bytes_done) / p.bytes_total : 1.0;
    constexpr int kWidth = 30;
    int filled = static_cast<int>(fraction * kWidth);
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    double mb = p.bytes_done / 1e6;
    fmt::print(stderr, "\r[{}] {:5.1f}% {:.1f}/{:.1f} MB {:.1f} MB/s {} docs {} tokens   ", bar, fraction * 100, mb,
               p.bytes_total / 1e6, p.seconds > 0 ? mb / p.seconds : 0.0, p.documents, p.tokens);
    if (last) fmt::print(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  std::chrono::steady_clock::time_point drawn_{};
};

}  // namespace

void add_preprocess_data(CLI::App& app) {
  auto* cmd = app.add_subcommand("preprocess-data", "Tokenize JSONL or text into Megatron .bin/.idx datasets");
  struct Flags {
    TokenizerFlags tokenizer;
    std::vector<std::string> inputs;
    std::vector<std::string> json_keys{"text"};
    std::string output_prefix;
    bool append_eod = false;
    int workers = 1;
    bool skip_bad = false;
    std::string format = "auto";
    std::string text_documents = "file";
  };
  auto flags = std::make_shared<Flags>();
  cmd->add_option("--input", flags->inputs, "JSONL / text files or directories")->required();
  cmd->add_option("--json-keys", flags->json_keys, "JSON fields to tokenize, one dataset each")->capture_default_str();
  flags->tokenizer.add_to(cmd, true);
  cmd->add_option("--output-prefix", flags->output_prefix, "writes <prefix>_<key>_document.bin/.idx")->required();
  cmd->add_flag("--append-eod", flags->append_eod, "end every document with the end-of-document token");
  cmd->add_option("--workers", flags->workers, "tokenizing threads")->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_flag("--skip-bad", flags->skip_bad, "count and leave out malformed JSONL lines instead of stopping");
  cmd->add_option("--input-format", flags->format, "auto (by extension: .jsonl/.json/.ndjson), jsonl or text")
      ->check(CLI::IsMember({"auto", "jsonl", "text"}))
      ->capture_default_str();
  cmd->add_option("--text-documents", flags->text_documents, "plain text: one document a file, or a line")
      ->check(CLI::IsMember({"file", "line"}))
      ->capture_default_str();
  cmd->callback([flags] {
    auto tokenizer = data::make_tokenizer(flags->tokenizer.spec());
    data::PreprocessOptions options;
    for (const auto& i : flags->inputs) options.inputs.emplace_back(i);
    options.json_keys = flags->json_keys;
    options.output_prefix = flags->output_prefix;
    options.append_eod = flags->append_eod;
    options.workers = flags->workers;
    options.skip_bad = flags->skip_bad;
    options.format = flags->format == "jsonl"  ? data::InputFormat::Jsonl
                     : flags->format == "text" ? data::InputFormat::Text
                                               : data::InputFormat::Auto;
    options.text_documents = flags->text_documents == "line" ? data::TextDocuments::Line : data::TextDocuments::File;
    ProgressBar bar;
    data::PreprocessProgress last;
    options.progress = [&](const data::PreprocessProgress& p) {
      last = p;
      bar.update(p);
    };
    auto result = data::preprocess_data(*tokenizer, options);
    bar.update(last, true);
    for (const auto& note : result.stale_files_removed) fmt::print("earlier run killed: {}\n", note);
    for (const auto& input : result.inputs) {
      fmt::print("{}: {} documents, {} tokens{}\n", input.path.string(), input.documents, input.tokens,
                 input.skipped ? fmt::format(", {} bad lines skipped", input.skipped) : "");
    }
    for (const auto& message : result.skipped_examples) fmt::print("  skipped {}\n", message);
    for (const auto& output : result.outputs) {
      fmt::print("wrote {}.bin/.idx: {} documents, {} tokens\n", output.prefix.string(), output.documents,
                 output.tokens);
    }
    fmt::print("{:.1f} MB in {:.2f} s ({:.1f} MB/s, {} workers)\n", result.bytes / 1e6, result.seconds,
               result.seconds > 0 ? result.bytes / 1e6 / result.seconds : 0.0, options.workers);
    fmt::print("{}\n", data::data_path_argument(result));
  });
}

}  // namespace kiln::cli
