#include "kiln/vision/cifar10_dataset.h"

#include <gtest/gtest.h>

#include <cstring>

#include "kiln/vision/cifar10_format.h"
#include "test_files.h"

namespace kiln::vision {
namespace cifar10_dataset_test {

using testing::error_of;
using testing::scratch_dir;
using testing::write_cifar_batch;
using testing::write_sparse_file;

TEST(Cifar10Dataset, ReadsLabelsAndPlanarImagesFromBatchFilesInOrder) {
  auto dir = scratch_dir();
  auto a = write_cifar_batch(dir / "a.bin", 100, 1, 0);
  auto b = write_cifar_batch(dir / "b.bin", 100, 2, 3);
  auto set = Cifar10Dataset::from_files({dir / "a.bin", dir / "b.bin"}, 100);
  ASSERT_EQ(set.size(), 200);
  ASSERT_EQ(set.images().size(), 200u * 3072);
  ASSERT_EQ(set.labels().size(), 200u);
  for (int i = 0; i < 200; ++i) {
    const auto& bytes = i < 100 ? a : b;
    const std::size_t record = std::size_t(i % 100) * 3073;
    EXPECT_EQ(set.label(i), bytes[record]) << i;
    EXPECT_EQ(std::memcmp(set.image(i), bytes.data() + record + 1, 3072), 0) << i;
    // The whole-set buffer is the same memory, NCHW.
    EXPECT_EQ(set.images().data() + std::size_t(i) * 3072, set.image(i));
  }
  auto wide = set.labels_int64();
  ASSERT_EQ(wide.size(), 200u);
  EXPECT_EQ(wide[103], (3 + 3) % 10);
}

TEST(Cifar10Dataset, MissingBatchFileIsNamedWithTheExpectedSize) {
  auto dir = scratch_dir();
  auto message = error_of([&] { Cifar10Dataset(dir, Cifar10Split::Test); });
  EXPECT_CONTAINS(message, (dir / "test_batch.bin").string());
  EXPECT_CONTAINS(message, "missing");
  EXPECT_CONTAINS(message, "30730000 bytes");
  EXPECT_CONTAINS(message, "kiln data cifar10");
}

TEST(Cifar10Dataset, TruncatedBatchFileIsNamedWithItsAndTheExpectedSize) {
  auto dir = scratch_dir() / "cifar-10-batches-bin";
  std::filesystem::create_directories(dir);
  for (const auto& f : cifar10::kTrainFiles) write_sparse_file(dir / f.name, cifar10::kBatchFileBytes);
  write_sparse_file(dir / "data_batch_4.bin", 30729999);
  auto message = error_of([&] { Cifar10Dataset(dir.parent_path(), Cifar10Split::Train); });
  EXPECT_CONTAINS(message, (dir / "data_batch_4.bin").string());
  EXPECT_CONTAINS(message, "is 30729999 bytes; expected 30730000 bytes");
}

TEST(Cifar10Dataset, FindsTheBatchesInTheFolderOrItsParent) {
  auto parent = scratch_dir();
  auto dir = parent / "cifar-10-batches-bin";
  std::filesystem::create_directories(dir);
  write_sparse_file(dir / "test_batch.bin", cifar10::kBatchFileBytes);
  for (const auto& where : {parent, dir}) {
    Cifar10Dataset test(where, Cifar10Split::Test);
    EXPECT_EQ(test.size(), cifar10::kTestSize);
    EXPECT_EQ(test.label(9999), 0);
  }
}

TEST(Cifar10Dataset, LabelOutsideTheTenClassesIsRejected) {
  auto dir = scratch_dir();
  auto bytes = write_cifar_batch(dir / "bad.bin", 10, 3);
  bytes[5 * 3073] = 12;
  std::ofstream(dir / "bad.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  auto message = error_of([&] { Cifar10Dataset::from_files({dir / "bad.bin"}, 10); });
  EXPECT_CONTAINS(message, "bad.bin");
  EXPECT_CONTAINS(message, "record 5 has label 12");
}

}  // namespace cifar10_dataset_test
}  // namespace kiln::vision
