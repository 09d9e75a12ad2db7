#include "kiln/vision/image_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "kiln/vision/cifar10_dataset.h"
#include "test_files.h"

namespace kiln::vision {
namespace image_loader_test {

using testing::error_of;

// `count` 3x4x4 images whose every byte is the image's index, labels index % 10; with the
// identity normalisation below each output float is the index it came from.
struct TinySet {
  std::vector<std::uint8_t> images, labels;
  explicit TinySet(int count) {
    for (int i = 0; i < count; ++i) {
      images.insert(images.end(), 48, static_cast<std::uint8_t>(i));
      labels.push_back(static_cast<std::uint8_t>(i % 10));
    }
  }
  ImageSource source() const { return {images.data(), labels.data(), std::int64_t(labels.size()), 3, 4, 4}; }
};

Normalization identity() { return {{0, 0, 0}, {1 / 255.0f, 1 / 255.0f, 1 / 255.0f}}; }

LoaderOptions options(int batch, int workers, bool shuffle = true) {
  LoaderOptions o;
  o.batch_size = batch;
  o.num_workers = workers;
  o.shuffle = shuffle;
  o.seed = 9;
  o.prefetch_batches = 2;
  o.normalization = identity();
  o.augment_options.padding = 1;
  return o;
}

// The image index of each sample of one epoch, in order, checking labels and batch sizes.
std::vector<int> run_epoch(ImageLoader& loader, std::int64_t epoch, std::vector<int>* sizes = nullptr) {
  loader.start_epoch(epoch);
  std::vector<int> seen;
  std::int64_t expected_index = 0;
  while (auto batch = loader.next()) {
    EXPECT_EQ(batch->index, expected_index++);
    EXPECT_EQ(batch->epoch, epoch);
    if (sizes) sizes->push_back(batch->size);
    for (int i = 0; i < batch->size; ++i) {
      int index = static_cast<int>(batch->images[i * 48] + 0.5f);
      EXPECT_EQ(batch->labels[i], index % 10);
      seen.push_back(index);
    }
  }
  EXPECT_FALSE(loader.next().has_value()) << "an ended epoch stays ended";
  return seen;
}

TEST(ImageLoader, EveryEpochVisitsEveryImageOnceInBatchesOfTheRequestedSize) {
  TinySet set(100);
  for (int workers : {0, 1, 3}) {
    ImageLoader loader(set.source(), options(32, workers));
    EXPECT_EQ(loader.batches_per_epoch(), 4);
    std::vector<int> sizes;
    auto seen = run_epoch(loader, 0, &sizes);
    EXPECT_EQ(sizes, (std::vector<int>{32, 32, 32, 4})) << workers << " workers";
    auto sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> all(100);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << workers << " workers";
    EXPECT_NE(seen, all) << "shuffled";
  }
}

TEST(ImageLoader, DropLastLeavesOutTheShortBatch) {
  TinySet set(100);
  auto o = options(32, 2);
  o.drop_last = true;
  ImageLoader loader(set.source(), o);
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  EXPECT_EQ(loader.samples_per_epoch(), 96);
  std::vector<int> sizes;
  auto seen = run_epoch(loader, 0, &sizes);
  EXPECT_EQ(sizes, (std::vector<int>{32, 32, 32}));
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end()) << "no image twice";
}

TEST(ImageLoader, OrderFollowsSeedAndEpochWhateverTheWorkerCount) {
  TinySet set(100);
  ImageLoader serial(set.source(), options(16, 0));
  ImageLoader threaded(set.source(), options(16, 3));
  auto epoch0 = run_epoch(serial, 0);
  EXPECT_EQ(run_epoch(threaded, 0), epoch0);
  auto epoch1 = run_epoch(threaded, 1);
  EXPECT_NE(epoch1, epoch0);
  EXPECT_EQ(run_epoch(serial, 1), epoch1);
  std::vector<int> order;
  for (auto i : serial.epoch_order(1)) order.push_back(int(i));
  EXPECT_EQ(order, epoch1);

  ImageLoader in_order(set.source(), options(16, 2, /*shuffle=*/false));
  std::vector<int> all(100);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(run_epoch(in_order, 5), all);
}

TEST(ImageLoader, AugmentedBatchesAreTheSeededTransformOfEachSample) {
  auto root = testing::scratch_dir();
  testing::write_cifar_batch(root / "batch.bin", 40, 5);
  auto set = Cifar10Dataset::from_files({root / "batch.bin"}, 40);
  LoaderOptions o;
  o.batch_size = 8;
  o.num_workers = 2;
  o.augment = true;
  o.seed = 1234;
  o.normalization = Normalization::cifar10_stats();
  ImageLoader loader(ImageSource::of(set), o);
  const std::int64_t epoch = 2;
  auto order = loader.epoch_order(epoch);
  loader.start_epoch(epoch);
  std::vector<float> expected(3072);
  int flipped_or_shifted = 0;
  while (auto batch = loader.next()) {
    for (int i = 0; i < batch->size; ++i) {
      const std::int64_t index = order[std::size_t(batch->index * 8 + i)];
      auto choice = choose_augmentation(1234, epoch, index, o.augment_options);
      flipped_or_shifted += choice.flip || choice.offset_x || choice.offset_y;
      transform_image(set.image(index), 3, 32, 32, choice, o.normalization, expected.data());
      ASSERT_EQ(std::memcmp(batch->images + i * 3072, expected.data(), 3072 * sizeof(float)), 0)
          << "batch " << batch->index << " sample " << i;
      ASSERT_EQ(batch->labels[i], set.label(index));
    }
  }
  EXPECT_GT(flipped_or_shifted, 30);
}

TEST(ImageLoader, RestartingAnEpochMidwayStartsItAfresh) {
  TinySet set(100);
  ImageLoader loader(set.source(), options(10, 3));
  loader.start_epoch(0);
  ASSERT_TRUE(loader.next().has_value());
  ASSERT_TRUE(loader.next().has_value());
  auto seen = run_epoch(loader, 1);
  ImageLoader fresh(set.source(), options(10, 0));
  EXPECT_EQ(seen, run_epoch(fresh, 1));
}

TEST(ImageLoader, ShardsSplitEachEpochLikeDistributedSampler) {
  TinySet set(10);
  std::vector<int> all;
  for (int shard = 0; shard < 3; ++shard) {
    auto o = options(2, 1);
    o.shard_index = shard;
    o.num_shards = 3;
    ImageLoader loader(set.source(), o);
    EXPECT_EQ(loader.samples_per_epoch(), 4) << "ceil(10 / 3) each";
    std::vector<int> sizes;
    auto seen = run_epoch(loader, 7, &sizes);
    EXPECT_EQ(sizes, (std::vector<int>{2, 2}));
    all.insert(all.end(), seen.begin(), seen.end());
  }
  // Together: the epoch's order, padded with its first two images to 12.
  ImageLoader whole(set.source(), options(2, 0));
  auto order = whole.epoch_order(7);
  std::vector<int> expected;
  for (int shard = 0; shard < 3; ++shard) {
    for (int i = shard; i < 12; i += 3) expected.push_back(int(order[std::size_t(i % 10)]));
  }
  EXPECT_EQ(all, expected);
  auto sorted = all;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  EXPECT_EQ(sorted.size(), 10u) << "every image in some shard";
}

TEST(ImageLoader, BadUseIsAClearError) {
  TinySet set(10);
  ImageLoader loader(set.source(), options(4, 1));
  EXPECT_CONTAINS(error_of([&] { loader.next(); }), "call start_epoch(epoch) first");
  auto o = options(0, 1);
  EXPECT_CONTAINS(error_of([&] { ImageLoader(set.source(), o); }), "batch_size must be positive");
  o = options(16, 1);
  o.drop_last = true;
  EXPECT_CONTAINS(error_of([&] { ImageLoader(set.source(), o); }), "10 images make no batch of 16");
  o = options(4, 1);
  o.normalization = Normalization{{0.5f}, {0.5f}};
  EXPECT_CONTAINS(error_of([&] { ImageLoader(set.source(), o); }), "1 means and 1 stds for 3-channel images");
  o = options(4, 1);
  o.shard_index = 2;
  o.num_shards = 2;
  EXPECT_CONTAINS(error_of([&] { ImageLoader(set.source(), o); }), "shard 2 of 2 does not exist");
}

}  // namespace image_loader_test
}  // namespace kiln::vision
