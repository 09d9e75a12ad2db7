#include "kiln/data/preprocess.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "kiln/data/indexed_dataset_writer.h"
#include "kiln/runtime/error.h"

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kBatchBytes = 1u << 20;
constexpr std::size_t kReadBlock = 1u << 20;
constexpr std::size_t kMaxSkippedExamples = 10;

bool is_jsonl(const fs::path& path, InputFormat format) {
  if (format != InputFormat::Auto) return format == InputFormat::Jsonl;
  std::string ext = path.extension().string();
  return ext == ".jsonl" || ext == ".json" || ext == ".ndjson";
}

bool is_blank(std::string_view s) { return s.find_first_not_of(" \t\r\n") == std::string_view::npos; }

// A slice of input: whole lines (JSONL, text lines) or whole files (text files).
struct Batch {
  std::int64_t sequence = 0;
  std::size_t input = 0;
  bool jsonl = false;
  std::int64_t first_line = 1;  // line number of units[0]
  std::string data;
  std::vector<std::pair<std::size_t, std::size_t>> units;  // (offset, size) in data
};

struct KeyTokens {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> lengths;  // one per document (0: an empty document)
};

struct BatchResult {
  std::int64_t sequence = 0;
  std::size_t input = 0;
  std::int64_t bytes = 0;
  std::vector<KeyTokens> keys;
  std::int64_t skipped = 0;
  std::vector<std::string> skipped_examples;
  std::string error;
};

class BatchEncoder {
 public:
  BatchEncoder(const BpeTokenizer& tokenizer, const PreprocessOptions& options, const std::vector<fs::path>& files)
      : tokenizer_(tokenizer), options_(options), files_(files) {}

  BatchResult encode(const Batch& batch) {
    BatchResult result;
    result.sequence = batch.sequence;
    result.input = batch.input;
    result.bytes = static_cast<std::int64_t>(batch.data.size());
    result.keys.resize(batch.jsonl ? options_.json_keys.size() : 1);
    try {
      for (std::size_t u = 0; u < batch.units.size(); ++u) {
        std::string_view unit(batch.data.data() + batch.units[u].first, batch.units[u].second);
        if (!batch.jsonl) {
          add(result.keys[0], unit);
          continue;
        }
        if (is_blank(unit)) continue;
        std::string why = encode_json(unit, result);
        if (why.empty()) continue;
        std::string message = fmt::format("{}:{}: {}", files_[batch.input].string(),
                                          batch.first_line + static_cast<std::int64_t>(u), why);
        if (!options_.skip_bad) {
          result.error = message + " (--skip-bad leaves such lines out)";
          return result;
        }
        ++result.skipped;
        if (result.skipped_examples.size() < kMaxSkippedExamples) result.skipped_examples.push_back(message);
      }
    } catch (const std::exception& e) {
      result.error = fmt::format("{}: {}", files_[batch.input].string(), e.what());
    }
    return result;
  }

 private:
  void add(KeyTokens& out, std::string_view text) {
    std::size_t before = out.tokens.size();
    tokenizer_.encode(text, state_, out.tokens);
    // As Megatron: the end-of-document token ends every non-empty document.
    if (options_.append_eod && out.tokens.size() > before) out.tokens.push_back(*tokenizer_.eod());
    out.lengths.push_back(static_cast<std::int32_t>(out.tokens.size() - before));
  }

  // Empty when the line was encoded; else why not (nothing is added for a bad line).
  std::string encode_json(std::string_view line, BatchResult& result) {
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return fmt::format("malformed JSON: {}", e.what());
    }
    if (!doc.is_object()) return "the line is not a JSON object";
    for (const auto& key : options_.json_keys) {
      auto it = doc.find(key);
      if (it == doc.end()) return fmt::format("no key \"{}\"", key);
      if (!it->is_string()) return fmt::format("\"{}\" is not a string", key);
    }
    for (std::size_t k = 0; k < options_.json_keys.size(); ++k) {
      add(result.keys[k], doc[options_.json_keys[k]].get_ref<const std::string&>());
    }
    return {};
  }

  const BpeTokenizer& tokenizer_;
  const PreprocessOptions& options_;
  const std::vector<fs::path>& files_;
  BpeTokenizer::State state_;
};

// Workers take batches from a queue and leave results by sequence number.
class WorkerPool {
 public:
  WorkerPool(int workers, const BpeTokenizer& tokenizer, const PreprocessOptions& options,
             const std::vector<fs::path>& files) {
    for (int w = 0; w < workers; ++w) {
      threads_.emplace_back([this, &tokenizer, &options, &files] {
        BatchEncoder encoder(tokenizer, options, files);
        while (true) {
          Batch batch;
          {
            std::unique_lock lock(mutex_);
            work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
            if (stopping_) return;
            batch = std::move(queue_.front());
            queue_.pop_front();
          }
          BatchResult result = encoder.encode(batch);
          {
            std::lock_guard lock(mutex_);
            done_.emplace(result.sequence, std::move(result));
          }
          result_ready_.notify_all();
        }
      });
    }
  }

  ~WorkerPool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_ready_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void submit(Batch batch) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(batch));
    }
    work_ready_.notify_one();
  }

  // The result with this sequence number, waiting for it.
  BatchResult take(std::int64_t sequence) {
    std::unique_lock lock(mutex_);
    result_ready_.wait(lock, [&] { return done_.count(sequence) > 0; });
    BatchResult result = std::move(done_.at(sequence));
    done_.erase(sequence);
    return result;
  }

 private:
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable result_ready_;
  std::deque<Batch> queue_;
  std::map<std::int64_t, BatchResult> done_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Cuts the inputs into batches, in order.
class BatchReader {
 public:
  BatchReader(const std::vector<fs::path>& files, const PreprocessOptions& options)
      : files_(files), options_(options) {}

  // False when the input is exhausted.
  bool next(Batch& batch) {
    batch = Batch{};
    batch.sequence = sequence_++;
    while (file_ < files_.size()) {
      bool jsonl = is_jsonl(files_[file_], options_.format);
      if (!jsonl && options_.text_documents == TextDocuments::File) {
        if (next_whole_files(batch)) return true;
        continue;
      }
      if (next_lines(batch, jsonl)) return true;
    }
    return false;
  }

 private:
  bool open_current() {
    if (in_.is_open()) return true;
    in_.open(files_[file_], std::ios::binary);
    KILN_CHECK(in_.is_open(), "cannot open {}: {}", files_[file_].string(), std::strerror(errno));
    carry_.clear();
    line_ = 1;
    return true;
  }

  void close_current() {
    in_.close();
    in_.clear();
    ++file_;
  }

  bool next_lines(Batch& batch, bool jsonl) {
    open_current();
    batch.input = file_;
    batch.jsonl = jsonl;
    batch.first_line = line_;
    batch.data = std::move(carry_);
    carry_.clear();
    // Read until the batch holds at least one whole line and ~kBatchBytes, or the file ends.
    bool eof = false;
    while (true) {
      std::size_t last_newline = batch.data.rfind('\n');
      if (last_newline != std::string::npos && batch.data.size() >= kBatchBytes) {
        carry_.assign(batch.data, last_newline + 1);
        batch.data.resize(last_newline + 1);
        break;
      }
      std::size_t at = batch.data.size();
      batch.data.resize(at + kReadBlock);
      in_.read(batch.data.data() + at, kReadBlock);
      batch.data.resize(at + static_cast<std::size_t>(in_.gcount()));
      KILN_CHECK(!in_.bad(), "cannot read {}", files_[file_].string());
      if (in_.eof()) {
        eof = true;
        break;
      }
    }
    for (std::size_t pos = 0; pos < batch.data.size();) {
      std::size_t end = batch.data.find('\n', pos);
      if (end == std::string::npos) end = batch.data.size();
      std::size_t size = end - pos;
      if (size > 0 && batch.data[pos + size - 1] == '\r') --size;
      if (jsonl || !is_blank(std::string_view(batch.data.data() + pos, size))) {
        batch.units.emplace_back(pos, size);
      } else {
        // A blank text line is no document; keep the numbering of JSONL lines right regardless.
        batch.units.emplace_back(pos, 0);
      }
      pos = end + 1;
      ++line_;
    }
    if (!jsonl) {
      std::erase_if(batch.units, [](const auto& u) { return u.second == 0; });
    }
    if (eof) close_current();
    return !batch.data.empty() || !batch.units.empty();
  }

  bool next_whole_files(Batch& batch) {
    batch.input = file_;
    batch.jsonl = false;
    // Several small files share a batch only when they are the same input (per-input counts).
    std::ifstream in(files_[file_], std::ios::binary);
    KILN_CHECK(in.is_open(), "cannot open {}: {}", files_[file_].string(), std::strerror(errno));
    batch.data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    KILN_CHECK(!in.bad(), "cannot read {}", files_[file_].string());
    batch.units.emplace_back(0, batch.data.size());
    ++file_;
    return true;
  }

  const std::vector<fs::path>& files_;
  const PreprocessOptions& options_;
  std::size_t file_ = 0;
  std::ifstream in_;
  std::string carry_;
  std::int64_t line_ = 1;
  std::int64_t sequence_ = 0;
};

}  // namespace

std::vector<fs::path> list_input_files(const std::vector<fs::path>& inputs) {
  std::vector<fs::path> files;
  for (const auto& input : inputs) {
    KILN_CHECK(fs::exists(input), "input {} does not exist", input.string());
    if (!fs::is_directory(input)) {
      files.push_back(input);
      continue;
    }
    std::vector<fs::path> found;
    for (auto it = fs::recursive_directory_iterator(input); it != fs::recursive_directory_iterator(); ++it) {
      if (it->path().filename().string().starts_with(".")) {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file()) found.push_back(it->path());
    }
    KILN_CHECK(!found.empty(), "input directory {} holds no files", input.string());
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

PreprocessResult preprocess_data(const BpeTokenizer& tokenizer, const PreprocessOptions& options) {
  auto start = std::chrono::steady_clock::now();
  KILN_CHECK(!options.inputs.empty(), "preprocess-data: no --input given");
  KILN_CHECK(!options.output_prefix.empty(), "preprocess-data: no --output-prefix given");
  KILN_CHECK(!options.json_keys.empty(), "preprocess-data: --json-keys is empty");
  for (std::size_t k = 0; k < options.json_keys.size(); ++k) {
    const auto& key = options.json_keys[k];
    KILN_CHECK(!key.empty(), "preprocess-data: --json-keys has an empty key (key {} of {})", k + 1,
               options.json_keys.size());
    for (std::size_t j = 0; j < k; ++j) {
      // Each key is its own dataset <prefix>_<key>_document: a repeated key would write one file twice.
      KILN_CHECK(options.json_keys[j] != key,
                 "preprocess-data: --json-keys names '{}' twice (keys {} and {}); each key is one output dataset", key,
                 j + 1, k + 1);
    }
  }
  KILN_CHECK(options.workers >= 1, "preprocess-data: --workers must be at least 1, not {}", options.workers);
  KILN_CHECK(!options.append_eod || tokenizer.eod().has_value(),
             "preprocess-data: --append-eod, but tokenizer {} has no end-of-document token", tokenizer.source());

  std::vector<fs::path> files = list_input_files(options.inputs);
  bool any_jsonl = false, any_text = false;
  PreprocessResult result;
  PreprocessProgress progress;
  for (const auto& f : files) {
    (is_jsonl(f, options.format) ? any_jsonl : any_text) = true;
    result.inputs.push_back({f, static_cast<std::int64_t>(fs::file_size(f)), 0, 0, 0});
    progress.bytes_total += result.inputs.back().bytes;
  }
  KILN_CHECK(!(any_text && options.json_keys.size() > 1),
             "preprocess-data: plain-text inputs have one field; give one --json-keys name (it names the output)");

  TokenDtype dtype = optimal_token_dtype(tokenizer.vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const auto& key : options.json_keys) {
    fs::path prefix = options.output_prefix.string() + "_" + key + "_document";
    writers.push_back(std::make_unique<IndexedDatasetWriter>(prefix, dtype));
    const auto& stale = writers.back()->stale_files_removed();
    result.stale_files_removed.insert(result.stale_files_removed.end(), stale.begin(), stale.end());
    result.outputs.push_back({key, prefix, 0, 0});
  }

  auto write = [&](BatchResult& batch) {
    KILN_CHECK(batch.error.empty(), "{}", batch.error);
    auto& input = result.inputs[batch.input];
    for (std::size_t k = 0; k < batch.keys.size(); ++k) {
      const auto& key = batch.keys[k];
      std::size_t offset = 0;
      for (std::int32_t length : key.lengths) {
        writers[k]->add_document(std::span(key.tokens).subspan(offset, length));
        offset += length;
      }
      input.documents += static_cast<std::int64_t>(key.lengths.size());
      input.tokens += static_cast<std::int64_t>(key.tokens.size());
      progress.documents += static_cast<std::int64_t>(key.lengths.size());
      progress.tokens += static_cast<std::int64_t>(key.tokens.size());
    }
    input.skipped += batch.skipped;
    result.skipped += batch.skipped;
    for (auto& m : batch.skipped_examples) {
      if (result.skipped_examples.size() < kMaxSkippedExamples) result.skipped_examples.push_back(std::move(m));
    }
    progress.bytes_done += batch.bytes;
    progress.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options.progress) options.progress(progress);
  };

  BatchReader reader(files, options);
  Batch batch;
  if (options.workers == 1) {
    BatchEncoder encoder(tokenizer, options, files);
    while (reader.next(batch)) {
      BatchResult encoded = encoder.encode(batch);
      write(encoded);
    }
  } else {
    WorkerPool pool(options.workers, tokenizer, options, files);
    // Enough batches in flight to keep every worker busy while the writer waits on the oldest.
    const std::int64_t max_in_flight = 3 * static_cast<std::int64_t>(options.workers);
    std::int64_t submitted = 0, written = 0;
    bool more = true;
    while (more || written < submitted) {
      while (more && submitted - written < max_in_flight) {
        more = reader.next(batch);
        if (more) {
          pool.submit(std::move(batch));
          ++submitted;
        }
      }
      if (written < submitted) {
        BatchResult encoded = pool.take(written);
        write(encoded);
        ++written;
      }
    }
  }

  for (std::size_t k = 0; k < writers.size(); ++k) {
    writers[k]->finish();
    result.outputs[k].documents = writers[k]->documents();
    result.outputs[k].tokens = writers[k]->tokens();
  }
  result.bytes = progress.bytes_done;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

std::string data_path_argument(const PreprocessResult& result) {
  std::string out = "--data-path";
  for (const auto& o : result.outputs) out += fmt::format(" {} {}", o.tokens, o.prefix.string());
  return out;
}

}  // namespace kiln::data
