#pragma once
// Megatron's BlendedDataset: samples drawn from several datasets in proportion to weights, in a
// fixed interleaving (sample i comes from the dataset furthest behind its share), so blending is
// as deterministic and resumable as the datasets it blends. And the builder that turns Megatron's
// --data-path ("w1 prefix1 w2 prefix2 ...", or one prefix) and --split into train/valid/test.
#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/data/gpt_dataset.h"
#include "kiln/data/token_dataset.h"

namespace kiln::data {

class BlendedDataset : public TokenDataset {
 public:
  // Weights need not sum to 1. Throws kiln::Error when a dataset is too small for its share.
  BlendedDataset(std::vector<std::shared_ptr<const TokenDataset>> datasets, std::vector<double> weights,
                 std::int64_t size);

  std::int64_t size() const override { return static_cast<std::int64_t>(dataset_index_.size()); }
  using TokenDataset::sample;
  void sample(std::int64_t index, std::vector<std::int32_t>& out) const override;
  // Which dataset sample `index` comes from.
  int source(std::int64_t index) const { return dataset_index_.at(index); }

 private:
  std::vector<std::shared_ptr<const TokenDataset>> datasets_;
  std::vector<std::uint16_t> dataset_index_;
  std::vector<std::int64_t> dataset_sample_index_;
};

struct BlendPart {
  double weight = 1.0;
  std::string prefix;
};

// Megatron's --data-path: one prefix, or weight/prefix pairs (space-separated words).
std::vector<BlendPart> parse_data_path(const std::vector<std::string>& words);
std::vector<BlendPart> parse_data_path(std::string_view text);

// Train, valid and test datasets (nullptr for an empty split). num_samples[i] <= 0 means one epoch
// of a single dataset; a blend of several needs the sample counts.
std::array<std::shared_ptr<const TokenDataset>, 3> build_gpt_datasets(const std::vector<BlendPart>& blend,
                                                                      std::string_view split,
                                                                      std::array<std::int64_t, 3> num_samples,
                                                                      const GptDatasetConfig& config);

}  // namespace kiln::data
