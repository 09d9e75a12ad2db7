#pragma once
// Writes a Megatron MMIDIDX version-1 dataset (indexed_dataset_format.h) byte for byte as
// Megatron's IndexedDatasetBuilder does. Both files are written under temporary names
// (`<prefix>.bin.tmp.<pid>`, `<prefix>.idx.tmp.<pid>`) and renamed into place by finish(), so a
// reader never sees half a file; without finish() (an error, an exception) they are removed.
//
// Replacing an existing dataset takes two renames, and the pair must never be lost between them:
// finish() keeps a hard link to the old .bin (`<prefix>.bin.old.<pid>`) until the new .idx is in
// place, and puts the old .bin back when the second rename fails, so the old pair stays readable.
// A writer killed mid-way (SIGKILL, power) leaves these names behind; the next writer of the same
// prefix removes those of processes that are gone and reports them (stale_files_removed()), and
// rolls an interrupted commit forward when both new files were complete.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
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

  // What the constructor cleaned up after an earlier writer of this prefix that died: one line per
  // file ("removed <path> (left by process <pid>, which is gone)").
  const std::vector<std::string>& stale_files_removed() const { return stale_files_removed_; }

  // Fault injection for tests: the rename finish() uses (default std::filesystem::rename).
  using RenameFunction = std::function<void(const std::filesystem::path&, const std::filesystem::path&)>;
  void set_rename_for_testing(RenameFunction rename) { rename_ = std::move(rename); }

  std::int64_t tokens() const { return tokens_; }
  std::int64_t documents() const { return static_cast<std::int64_t>(document_indices_.size()) - 1; }
  std::int64_t sequences() const { return static_cast<std::int64_t>(sequence_lengths_.size()); }
  const std::filesystem::path& prefix() const { return prefix_; }

 private:
  void write_tokens(std::span<const std::int32_t> tokens);
  void discard();
  void remove_stale_files();
  void commit_pair(const std::filesystem::path& idx_tmp);

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
  std::vector<std::string> stale_files_removed_;
  RenameFunction rename_;
};

}  // namespace kiln::data
