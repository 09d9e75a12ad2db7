// bench_tokenizer: Kiln's byte-level BPE on one thread, in MB/s, over the "text" fields of a JSONL
// file (the same documents bench/tokenizer_peers.py gives Hugging Face tokenizers and tiktoken).
//
//   bench_tokenizer --type GPT2BPETokenizer --tokenizer-model DIR --input corpus.jsonl [--repeat 3]
//                   [--ids-out ids.txt]
// Prints one JSON object: bytes, tokens, the best of --repeat timings, MB/s. --ids-out writes the
// ids of each document on one line (for checking against other tokenizers by hand).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/data/tokenizer_factory.h"
#include "kiln/data/tokenizer_files.h"
#include "kiln/runtime/error.h"

namespace {

// CPU time of this thread: on a shared machine it moves less than wall time with the load.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

std::vector<std::string> read_documents(const std::string& path) {
  std::string all = kiln::data::read_text_file(path);
  std::vector<std::string> docs;
  std::size_t pos = 0, line = 0;
  while (pos < all.size()) {
    std::size_t end = all.find('\n', pos);
    if (end == std::string::npos) end = all.size();
    ++line;
    std::string_view text(all.data() + pos, end - pos);
    pos = end + 1;
    if (text.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto doc = nlohmann::json::parse(text, nullptr, false);
    KILN_CHECK(!doc.is_discarded() && doc.contains("text") && doc["text"].is_string(),
               "{}:{}: not a JSON object with a string \"text\"", path, line);
    docs.push_back(doc["text"].get<std::string>());
  }
  return docs;
}

int run(int argc, char** argv) {
  kiln::data::TokenizerSpec spec;
  std::string input, ids_out;
  int repeat = 3;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    KILN_CHECK(i + 1 < argc, "bench_tokenizer: {} needs a value", flag);
    std::string value = argv[++i];
    if (flag == "--type" || flag == "--tokenizer-type")
      spec.type = value;
    else if (flag == "--tokenizer-model")
      spec.model = value;
    else if (flag == "--vocab-file")
      spec.vocab_file = value;
    else if (flag == "--merge-file")
      spec.merge_file = value;
    else if (flag == "--input")
      input = value;
    else if (flag == "--repeat")
      repeat = std::max(1, std::stoi(value));
    else if (flag == "--ids-out")
      ids_out = value;
    else
      KILN_FAIL("bench_tokenizer: unknown flag {}", flag);
  }
  KILN_CHECK(!input.empty() && !spec.type.empty(), "usage: bench_tokenizer --type T --tokenizer-model P --input F");
  auto load_start = std::chrono::steady_clock::now();
  auto tokenizer = kiln::data::make_tokenizer(spec);
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  auto docs = read_documents(input);
  std::size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();

  std::vector<std::int32_t> ids;
  ids.reserve(bytes);
  double best = 1e30, best_cpu = 1e30;
  std::size_t tokens = 0;
  for (int r = 0; r < repeat; ++r) {
    // A fresh state each repetition: the timing includes filling the piece cache.
    kiln::data::BpeTokenizer::State state;
    tokens = 0;
    auto start = std::chrono::steady_clock::now();
    double cpu_start = thread_cpu_seconds();
    for (const auto& d : docs) {
      ids.clear();
      tokenizer->encode(d, state, ids);
      tokens += ids.size();
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    best_cpu = std::min(best_cpu, thread_cpu_seconds() - cpu_start);
  }
  if (!ids_out.empty()) {
    std::ofstream out(ids_out);
    kiln::data::BpeTokenizer::State state;
    for (const auto& d : docs) {
      ids.clear();
      tokenizer->encode(d, state, ids);
      out << fmt::format("{}\n", fmt::join(ids, " "));
    }
  }
  fmt::print(
      "{{\"tokenizer\": \"{}\", \"documents\": {}, \"bytes\": {}, \"tokens\": {}, \"seconds\": {:.4f}, "
      "\"mb_per_s\": {:.2f}, \"cpu_seconds\": {:.4f}, \"mb_per_cpu_s\": {:.2f}, \"load_seconds\": {:.3f}, "
      "\"jit\": {}}}\n",
      spec.type, docs.size(), bytes, tokens, best, bytes / best / 1e6, best_cpu, bytes / best_cpu / 1e6, load_s,
      tokenizer->pretokenizer().jit() ? "true" : "false");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
    return 1;
  }
}
