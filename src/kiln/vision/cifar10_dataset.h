#pragma once
// Cifar10Dataset: one split of CIFAR-10 read from the binary batches into plain host memory:
// images as uint8 NCHW (N x 3 x 32 x 32, contiguous, in pinned memory so the whole set can be
// copied to a GPU at full speed) and labels as bytes 0..9. Holds no tensor type on purpose.
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "kiln/runtime/pinned_memory.h"

namespace kiln::vision {

enum class Cifar10Split { Train, Test };

class Cifar10Dataset {
 public:
  // Reads data_batch_1..5.bin (Train, 50,000 images) or test_batch.bin (Test, 10,000) from
  // `data_dir`, which is `cifar-10-batches-bin` itself or its parent. Throws kiln::Error naming
  // the file and the expected size (30,730,000 bytes) when a file is missing or truncated.
  // Does not download: call ensure_cifar10() (cifar10_download.h) first for that.
  Cifar10Dataset(const std::filesystem::path& data_dir, Cifar10Split split);

  // Reads the given files in order, each of exactly `records_per_file` records (10,000 in the
  // official batches; tests write small files).
  static Cifar10Dataset from_files(const std::vector<std::filesystem::path>& files, std::int64_t records_per_file);

  std::int64_t size() const { return size_; }
  // The whole split as one buffer: size() x 3 x 32 x 32 bytes, NCHW, channels R, G, B.
  std::span<const std::uint8_t> images() const {
    return {static_cast<const std::uint8_t*>(images_.get()), static_cast<std::size_t>(size_ * kImageBytes)};
  }
  // size() bytes, each a class number 0..9.
  std::span<const std::uint8_t> labels() const { return labels_; }
  // The labels widened to int64, as cross-entropy losses take them.
  std::vector<std::int64_t> labels_int64() const { return {labels_.begin(), labels_.end()}; }

  // Image i as 3 x 32 x 32 bytes (planar R, G, B); label i.
  const std::uint8_t* image(std::int64_t i) const { return images().data() + i * kImageBytes; }
  int label(std::int64_t i) const { return labels_[static_cast<std::size_t>(i)]; }

  static constexpr std::int64_t kImageBytes = 3 * 32 * 32;

 private:
  Cifar10Dataset() = default;
  void load(const std::vector<std::filesystem::path>& files, std::int64_t records_per_file);

  PinnedBuffer images_;
  std::vector<std::uint8_t> labels_;
  std::int64_t size_ = 0;
};

}  // namespace kiln::vision
