#pragma once
// Megatron's GPTDataset: samples of sequence_length + 1 tokens (inputs and shifted labels) cut
// from the documents of a split laid end to end, crossing document boundaries; consecutive
// samples share one token, as in Megatron. The document order is shuffled per epoch and the
// samples are shuffled again, both from the seed, so a sample's tokens depend only on the dataset,
// the split, the sequence length, the seed and the sample count: deterministic and resumable.
//
// The three index arrays (document order, sample starts, sample order) are cached on disk in
// cache_dir, in a file named by a hash of everything they depend on. The cache carries a checksum
// of its arrays, and every entry is checked against the dataset when loaded (documents inside the
// split, sample boundaries inside their documents and in order, the sample order a permutation),
// so a cache that does not match (another dataset file, truncated, damaged bytes) is rebuilt, with
// a warning on stderr saying why (cache_rebuilt_because()); it is never read out of bounds.
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/data/indexed_dataset.h"
#include "kiln/data/token_dataset.h"

namespace kiln::data {

// Sequences [begin, end) of an indexed dataset.
struct SplitRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

// Megatron's --split "969,30,1" (or "0.9,0.1"; missing parts are 0): train, valid and test
// ranges over `sequences`, proportional to the weights, rounded as Megatron rounds them.
std::array<SplitRange, 3> split_ranges(std::string_view split, std::int64_t sequences);

struct GptDatasetConfig {
  std::int64_t sequence_length = 0;
  std::uint64_t seed = 1234;
  std::filesystem::path cache_dir;  // empty: indices are built in memory each time
};

class GptDataset : public TokenDataset {
 public:
  // num_samples <= 0: one epoch's worth ((tokens - 1) / sequence_length samples).
  GptDataset(std::shared_ptr<const IndexedDataset> data, SplitRange range, std::int64_t num_samples,
             const GptDatasetConfig& config, std::string split_name = "train");

  std::int64_t size() const override { return num_samples_; }
  using TokenDataset::sample;
  void sample(std::int64_t index, std::vector<std::int32_t>& out) const override;

  std::int64_t epochs() const { return epochs_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }
  const std::filesystem::path& cache_file() const { return cache_file_; }
  // Why an existing cache file was not used and was rebuilt (empty when none was there or it was used).
  const std::string& cache_rebuilt_because() const { return cache_rebuilt_because_; }
  std::int64_t tokens_per_epoch() const { return tokens_per_epoch_; }

 private:
  void build_indices();
  bool load_cache(const std::string& description);
  // Empty when the loaded arrays are consistent with the dataset and the split; else what is wrong.
  std::string check_indices() const;
  void save_cache(const std::string& description) const;

  std::shared_ptr<const IndexedDataset> data_;
  SplitRange range_;
  GptDatasetConfig config_;
  std::string split_name_;
  std::int64_t num_samples_ = 0;
  std::int64_t tokens_per_epoch_ = 0;
  std::int64_t epochs_ = 0;
  std::vector<std::int64_t> document_index_;  // sequence ids, epoch after epoch, each epoch shuffled
  std::vector<std::int64_t> sample_index_;    // 2 per sample boundary: (position in document_index_, offset)
  std::vector<std::int64_t> shuffle_index_;   // sample order
  std::filesystem::path cache_file_;
  bool loaded_from_cache_ = false;
  std::string cache_rebuilt_because_;
};

}  // namespace kiln::data
