#pragma once
// Writes a Megatron MMIDIDX version-1 dataset (indexed_dataset_format.h) byte for byte as
// Megatron's IndexedDatasetBuilder does. Both files are written under temporary names and renamed
// into place by finish(), so a reader never sees half a dataset; without finish() (an error, an
// exception) the temporary files are removed.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <vector>

#include "kiln/data/indexed_dataset_format.h"

namespace kiln::data {

class IndexedDatasetWriter {
 public:
  // `prefix` without .bin/.idx. Only integer dtypes hold token ids.
  IndexedDatasetWriter(std::filesystem::path prefix, TokenDtype dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One document of one sequence. An empty document adds a document boundary and no sequence,
  // as Megatron does for text that tokenizes to nothing.
  void add_document(std::span<const std::int32_t> tokens);
  // One document made of several sequences (sentences) whose lengths sum to tokens.size().
  void add_document(std::span<const std::int32_t> tokens, std::span<const std::int32_t> sequence_lengths);

  // Writes the index and renames both files into place.
  void finish();

  std::int64_t tokens() const { return tokens_; }
  std::int64_t documents() const { return static_cast<std::int64_t>(document_indices_.size()) - 1; }
  std::int64_t sequences() const { return static_cast<std::int64_t>(sequence_lengths_.size()); }
  const std::filesystem::path& prefix() const { return prefix_; }

 private:
  void write_tokens(std::span<const std::int32_t> tokens);
  void discard();

  std::filesystem::path prefix_;
  TokenDtype dtype_;
  int item_size_;
  std::filesystem::path bin_tmp_;
  std::FILE* bin_ = nullptr;
  std::vector<std::int32_t> sequence_lengths_;
  std::vector<std::int64_t> document_indices_{0};
  std::vector<unsigned char> buffer_;
  std::int64_t tokens_ = 0;
  bool finished_ = false;
};

}  // namespace kiln::data
