// `kiln inspect-data PREFIX`: what a .bin/.idx pair holds: counts, the length histogram and the
// first documents, decoded when a tokenizer is given.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "commands.h"
#include "kiln/data/indexed_dataset.h"
#include "tokenizer_flags.h"

namespace kiln::cli {

namespace {

// Printable text: control characters escaped, valid UTF-8 left alone, cut at max_bytes.
std::string printable(std::string_view text, std::size_t max_bytes) {
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < max_bytes; ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  if (text.size() > max_bytes) out += fmt::format(" ... ({} more bytes)", text.size() - max_bytes);
  return out;
}

void print_histogram(std::span<const std::int32_t> lengths) {
  if (lengths.empty()) return;
  // Powers of two: [0], [1], [2,3], [4,7], ...
  std::vector<std::int64_t> buckets(33, 0);
  for (std::int32_t n : lengths) buckets[n == 0 ? 0 : 1 + static_cast<int>(std::floor(std::log2(n)))]++;
  std::int64_t most = *std::max_element(buckets.begin(), buckets.end());
  fmt::print("sequence length histogram:\n");
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    if (buckets[b] == 0) continue;
    std::int64_t lo = b == 0 ? 0 : std::int64_t{1} << (b - 1);
    std::int64_t hi = b == 0 ? 0 : (std::int64_t{1} << b) - 1;
    int width = static_cast<int>(40.0 * buckets[b] / most + 0.5);
    fmt::print("  {:>10} - {:<10} {:>10}  {}\n", lo, hi, buckets[b], std::string(std::max(width, 1), '#'));
  }
}

}  // namespace

void add_inspect_data(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect-data", "Counts, length histogram and first documents of a .bin/.idx pair");
  struct Flags {
    std::string prefix;
    TokenizerFlags tokenizer;
    int show = 3;
    std::size_t max_bytes = 400;
  };
  auto flags = std::make_shared<Flags>();
  cmd->add_option("prefix", flags->prefix, "dataset prefix (path without .bin/.idx)")->required();
  flags->tokenizer.add_to(cmd, false);
  cmd->add_option("--show", flags->show, "how many documents to print")->capture_default_str();
  cmd->add_option("--max-bytes", flags->max_bytes, "bytes of each document to print")->capture_default_str();
  cmd->callback([flags] {
    data::IndexedDataset ds(flags->prefix);
    fmt::print("{}: dtype {}, {} documents, {} sequences, {} tokens\n", ds.prefix().string(),
               data::dtype_name(ds.dtype()), ds.document_count(), ds.sequence_count(), ds.token_count());
    auto lengths = ds.sequence_lengths();
    if (!lengths.empty()) {
      std::vector<std::int32_t> sorted(lengths.begin(), lengths.end());
      std::sort(sorted.begin(), sorted.end());
      fmt::print("sequence lengths: min {}, median {}, mean {:.1f}, p99 {}, max {}\n", sorted.front(),
                 sorted[sorted.size() / 2], static_cast<double>(ds.token_count()) / sorted.size(),
                 sorted[std::min(sorted.size() - 1, sorted.size() * 99 / 100)], sorted.back());
    }
    print_histogram(lengths);
    std::shared_ptr<const data::BpeTokenizer> tokenizer;
    if (!flags->tokenizer.type.empty()) tokenizer = data::make_tokenizer(flags->tokenizer.spec());
    for (std::int64_t d = 0; d < std::min<std::int64_t>(flags->show, ds.document_count()); ++d) {
      auto tokens = ds.document(d);
      fmt::print("document {} ({} tokens):\n", d, tokens.size());
      if (tokenizer) {
        fmt::print("  {}\n", printable(tokenizer->decode(tokens), flags->max_bytes));
      } else {
        std::size_t n = std::min<std::size_t>(tokens.size(), 64);
        fmt::print("  {}{}\n", fmt::join(tokens.begin(), tokens.begin() + n, " "), n < tokens.size() ? " ..." : "");
      }
    }
  });
}

}  // namespace kiln::cli
