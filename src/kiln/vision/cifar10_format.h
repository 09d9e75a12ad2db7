#pragma once
// The CIFAR-10 binary format (https://www.cs.toronto.edu/~kriz/cifar.html, "binary version"):
// folder `cifar-10-batches-bin/` with data_batch_1..5.bin (training) and test_batch.bin, each
// 10,000 records of 1 label byte followed by 1024 red, 1024 green and 1024 blue bytes (32x32,
// row-major), and batches.meta.txt with the class names, one per line.
#include <array>
#include <cstdint>
#include <string_view>

namespace kiln::vision::cifar10 {

inline constexpr int kImageSide = 32;
inline constexpr int kChannels = 3;
inline constexpr int kNumClasses = 10;
inline constexpr std::int64_t kPixelsPerChannel = kImageSide * kImageSide;  // 1024
inline constexpr std::int64_t kImageBytes = kChannels * kPixelsPerChannel;  // 3072
inline constexpr std::int64_t kRecordBytes = 1 + kImageBytes;               // 3073
inline constexpr std::int64_t kRecordsPerBatchFile = 10000;
inline constexpr std::int64_t kBatchFileBytes = kRecordBytes * kRecordsPerBatchFile;  // 30,730,000
inline constexpr std::int64_t kTrainSize = 5 * kRecordsPerBatchFile;                  // 50,000
inline constexpr std::int64_t kTestSize = kRecordsPerBatchFile;                       // 10,000

inline constexpr std::string_view kBatchesFolder = "cifar-10-batches-bin";
inline constexpr std::string_view kMetaFile = "batches.meta.txt";

inline constexpr std::array<std::string_view, kNumClasses> kClassNames = {
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};

struct BatchFile {
  std::string_view name;
  std::string_view md5;  // of the official file, as published with the dataset
};
inline constexpr std::array<BatchFile, 5> kTrainFiles = {{
    {"data_batch_1.bin", "5dd7e06a14cb22eb9f671a540d1b7c25"},
    {"data_batch_2.bin", "5ea93a67294ea407fff1d09f752e9692"},
    {"data_batch_3.bin", "942cd6a4bcdd0dd3c604fbe906cb4421"},
    {"data_batch_4.bin", "ae636b3ba5c66a11e91e8cb52e771fcb"},
    {"data_batch_5.bin", "53f37980c15c3d472c316c40844f3f0d"},
}};
inline constexpr BatchFile kTestFile = {"test_batch.bin", "803d5f7f4d78ea53de84dbe85f74fb6d"};

}  // namespace kiln::vision::cifar10
