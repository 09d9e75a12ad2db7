#pragma once
// Megatron's tools/preprocess_data.py in C++: text in, tokenized MMIDIDX datasets out.
//
// Inputs are files or directories (walked recursively, sorted, hidden names skipped). A file is
// JSONL when it ends in .jsonl/.json/.ndjson (one JSON object a line; each --json-keys field is one
// document of the dataset `<prefix>_<key>_document`), else plain text: the whole file one document,
// or with TextDocuments::Line each non-blank line one document (dataset `<prefix>_<key>_document`
// for the first key).
//
// Work is cut into ~1 MB batches that `workers` threads tokenize; the calling thread reads input and
// writes output in input order, so the output is the same whatever the number of workers.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "kiln/data/bpe_tokenizer.h"

namespace kiln::data {

enum class InputFormat { Auto, Jsonl, Text };
enum class TextDocuments { File, Line };

struct PreprocessProgress {
  std::int64_t bytes_done = 0;
  std::int64_t bytes_total = 0;
  std::int64_t documents = 0;
  std::int64_t tokens = 0;
  double seconds = 0;
};

struct PreprocessOptions {
  std::vector<std::filesystem::path> inputs;
  std::vector<std::string> json_keys{"text"};
  std::filesystem::path output_prefix;
  bool append_eod = false;
  int workers = 1;
  // A malformed JSONL line (bad JSON, a missing or non-string key) is an error naming the file and
  // line; with skip_bad it is counted, reported in the result, and left out.
  bool skip_bad = false;
  InputFormat format = InputFormat::Auto;
  TextDocuments text_documents = TextDocuments::File;
  // Called on the calling thread after each batch is written.
  std::function<void(const PreprocessProgress&)> progress;
};

struct InputSummary {
  std::filesystem::path path;
  std::int64_t bytes = 0;
  std::int64_t documents = 0;
  std::int64_t tokens = 0;
  std::int64_t skipped = 0;
};

struct OutputSummary {
  std::string key;
  std::filesystem::path prefix;  // without .bin/.idx
  std::int64_t documents = 0;
  std::int64_t tokens = 0;
};

struct PreprocessResult {
  std::vector<InputSummary> inputs;
  std::vector<OutputSummary> outputs;
  std::int64_t skipped = 0;
  std::vector<std::string> skipped_examples;  // "file:line: why", the first few
  // Temporaries of an earlier run that was killed, cleaned up before this one wrote anything.
  std::vector<std::string> stale_files_removed;
  double seconds = 0;
  std::int64_t bytes = 0;
};

PreprocessResult preprocess_data(const BpeTokenizer& tokenizer, const PreprocessOptions& options);

// "--data-path N1 P1 N2 P2": each output's token count and prefix, as Megatron's --data-path takes
// them (weights proportional to tokens).
std::string data_path_argument(const PreprocessResult& result);

// The files `inputs` stand for: files as given, directories walked (sorted, hidden names skipped).
std::vector<std::filesystem::path> list_input_files(const std::vector<std::filesystem::path>& inputs);

}  // namespace kiln::data
