#include "kiln/data/blended_dataset.h"

#include <cmath>
#include <sstream>

#include "kiln/runtime/error.h"

namespace kiln::data {

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const TokenDataset>> datasets, std::vector<double> weights,
                               std::int64_t size)
    : datasets_(std::move(datasets)) {
  KILN_CHECK(!datasets_.empty() && datasets_.size() == weights.size(), "BlendedDataset: {} datasets but {} weights",
             datasets_.size(), weights.size());
  KILN_CHECK(datasets_.size() < 65536, "BlendedDataset: at most 65535 datasets");
  KILN_CHECK(size >= 0, "BlendedDataset: negative size {}", size);
  double total = 0;
  for (double w : weights) {
    KILN_CHECK(w >= 0 && std::isfinite(w), "BlendedDataset: weight {} is not a non-negative number", w);
    total += w;
  }
  KILN_CHECK(total > 0, "BlendedDataset: the weights sum to 0");
  for (double& w : weights) w /= total;

  // Megatron's build_blending_indices: each sample goes to the dataset furthest below its share.
  std::vector<std::int64_t> taken(datasets_.size(), 0);
  dataset_index_.resize(size);
  dataset_sample_index_.resize(size);
  for (std::int64_t i = 0; i < size; ++i) {
    double scale = std::max(static_cast<double>(i), 1.0);
    std::size_t best = 0;
    double best_error = weights[0] * scale - static_cast<double>(taken[0]);
    for (std::size_t d = 1; d < datasets_.size(); ++d) {
      double error = weights[d] * scale - static_cast<double>(taken[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    dataset_index_[i] = static_cast<std::uint16_t>(best);
    dataset_sample_index_[i] = taken[best]++;
  }
  for (std::size_t d = 0; d < datasets_.size(); ++d) {
    KILN_CHECK(taken[d] <= datasets_[d]->size(), "BlendedDataset: dataset {} has {} samples, its share needs {}", d,
               datasets_[d]->size(), taken[d]);
  }
}

void BlendedDataset::sample(std::int64_t index, std::vector<std::int32_t>& out) const {
  KILN_CHECK(index >= 0 && index < size(), "BlendedDataset: sample {} out of range (0..{})", index, size());
  datasets_[dataset_index_[index]]->sample(dataset_sample_index_[index], out);
}

std::vector<BlendPart> parse_data_path(const std::vector<std::string>& words) {
  KILN_CHECK(!words.empty(), "--data-path is empty");
  if (words.size() == 1) return {{1.0, words[0]}};
  KILN_CHECK(words.size() % 2 == 0, "--data-path: give one prefix or weight/prefix pairs, not {} words", words.size());
  std::vector<BlendPart> parts;
  for (std::size_t i = 0; i < words.size(); i += 2) {
    std::size_t used = 0;
    double weight = 0;
    try {
      weight = std::stod(words[i], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KILN_CHECK(used == words[i].size() && std::isfinite(weight) && weight >= 0,
               "--data-path: '{}' (before {}) is not a finite weight >= 0", words[i], words[i + 1]);
    parts.push_back({weight, words[i + 1]});
  }
  return parts;
}

std::vector<BlendPart> parse_data_path(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return parse_data_path(words);
}

std::array<std::shared_ptr<const TokenDataset>, 3> build_gpt_datasets(const std::vector<BlendPart>& blend,
                                                                      std::string_view split,
                                                                      std::array<std::int64_t, 3> num_samples,
                                                                      const GptDatasetConfig& config) {
  static constexpr const char* kNames[3] = {"train", "valid", "test"};
  KILN_CHECK(!blend.empty(), "build_gpt_datasets: no data");
  std::array<std::shared_ptr<const TokenDataset>, 3> out;
  std::vector<std::shared_ptr<const IndexedDataset>> data;
  for (const auto& part : blend) data.push_back(std::make_shared<const IndexedDataset>(part.prefix));
  for (int s = 0; s < 3; ++s) {
    if (blend.size() == 1) {
      auto range = split_ranges(split, data[0]->sequence_count())[s];
      if (range.end > range.begin) {
        out[s] = std::make_shared<const GptDataset>(data[0], range, num_samples[s], config, kNames[s]);
      }
      continue;
    }
    bool empty = true;
    for (const auto& d : data) {
      auto range = split_ranges(split, d->sequence_count())[s];
      empty = empty && range.begin == range.end;
    }
    if (empty) continue;
    KILN_CHECK(num_samples[s] > 0, "a blend of {} datasets needs the number of {} samples", blend.size(), kNames[s]);
    double total = 0;
    for (const auto& part : blend) total += part.weight;
    std::vector<std::shared_ptr<const TokenDataset>> parts;
    std::vector<double> weights;
    for (std::size_t d = 0; d < blend.size(); ++d) {
      auto range = split_ranges(split, data[d]->sequence_count())[s];
      if (range.end == range.begin || blend[d].weight == 0) continue;
      // As Megatron: half a percent more than the share, so rounding never runs a part dry.
      auto samples = static_cast<std::int64_t>(std::ceil(blend[d].weight / total * num_samples[s] * 1.005));
      parts.push_back(
          std::make_shared<const GptDataset>(data[d], range, std::max<std::int64_t>(samples, 1), config, kNames[s]));
      weights.push_back(blend[d].weight);
    }
    if (!parts.empty()) out[s] = std::make_shared<const BlendedDataset>(parts, weights, num_samples[s]);
  }
  return out;
}

}  // namespace kiln::data
