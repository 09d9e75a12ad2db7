#pragma once
// Reads a Megatron MMIDIDX version-1 dataset (indexed_dataset_format.h), whoever wrote it. The
// index is checked whole when opened (magic, version, dtype, sizes, pointers inside the .bin), so
// a truncated or foreign file is an error naming the file and what is wrong, never a bad read.
// The .bin is memory-mapped; token ids come out as int32 whatever the stored dtype.
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "kiln/data/indexed_dataset_format.h"
#include "kiln/data/mapped_file.h"

namespace kiln::data {

class IndexedDataset {
 public:
  // `prefix` without .bin/.idx (a trailing ".bin" or ".idx" is accepted and dropped).
  explicit IndexedDataset(std::filesystem::path prefix);

  std::int64_t sequence_count() const { return static_cast<std::int64_t>(sequence_lengths_.size()); }
  std::int64_t document_count() const { return static_cast<std::int64_t>(document_indices_.size()) - 1; }
  std::int64_t token_count() const { return token_count_; }
  TokenDtype dtype() const { return dtype_; }
  const std::filesystem::path& prefix() const { return prefix_; }
  std::size_t index_file_size() const { return index_file_size_; }

  std::span<const std::int32_t> sequence_lengths() const { return sequence_lengths_; }
  std::span<const std::int64_t> sequence_pointers() const { return sequence_pointers_; }
  std::span<const std::int64_t> document_indices() const { return document_indices_; }

  // Copies `length` ids of sequence `sequence` from `offset` into out[0..length).
  void read(std::int64_t sequence, std::int64_t offset, std::int64_t length, std::int32_t* out) const;
  std::vector<std::int32_t> sequence(std::int64_t sequence) const;
  // All the tokens of document `document` (its sequences back to back).
  std::vector<std::int32_t> document(std::int64_t document) const;

 private:
  std::filesystem::path prefix_;
  TokenDtype dtype_ = TokenDtype::UInt16;
  int item_size_ = 2;
  std::vector<std::int32_t> sequence_lengths_;
  std::vector<std::int64_t> sequence_pointers_;
  std::vector<std::int64_t> document_indices_;
  std::int64_t token_count_ = 0;
  std::size_t index_file_size_ = 0;
  MappedFile bin_;
};

}  // namespace kiln::data
