#pragma once
// What training reads: a fixed number of samples, each a window of token ids, by index. Random
// access by index is what makes a run resumable: after `consumed` samples, the next is
// sample(consumed), whatever happened before.
#include <cstdint>
#include <vector>

namespace kiln::data {

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  virtual std::int64_t size() const = 0;
  // Replaces `out` with sample `index` (0 <= index < size()).
  virtual void sample(std::int64_t index, std::vector<std::int32_t>& out) const = 0;

  std::vector<std::int32_t> sample(std::int64_t index) const {
    std::vector<std::int32_t> out;
    sample(index, out);
    return out;
  }
};

// Reads samples in order from a sample counter, for a training loop to resume from a checkpoint's
// consumed-sample count.
class SampleCursor {
 public:
  SampleCursor(const TokenDataset& dataset, std::int64_t consumed_samples = 0)
      : dataset_(dataset), position_(consumed_samples) {}

  // False once every sample has been read.
  bool next(std::vector<std::int32_t>& out) {
    if (position_ >= dataset_.size()) return false;
    dataset_.sample(position_++, out);
    return true;
  }
  // Samples consumed so far: what a checkpoint stores.
  std::int64_t position() const { return position_; }

 private:
  const TokenDataset& dataset_;
  std::int64_t position_;
};

}  // namespace kiln::data
