// Cifar10Dataset::from_files on arbitrary bytes, as many 3,073-byte records as the input holds
// (at least one): the images and labels, or a kiln::Error naming the file.
#include <algorithm>
#include <cstring>
#include <optional>

#include "fuzz_support.h"
#include "kiln/vision/cifar10_dataset.h"
#include "kiln/vision/cifar10_format.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace cifar10 = kiln::vision::cifar10;
  static const std::filesystem::path path = kiln::fuzz::scratch_path("data_batch_1.bin");
  kiln::fuzz::write_file(path, {data, size});
  const std::int64_t records = std::max<std::int64_t>(1, static_cast<std::int64_t>(size) / cifar10::kRecordBytes);
  std::optional<kiln::vision::Cifar10Dataset> set;
  if (!kiln::fuzz::parses(path.string(),
                          [&] { set.emplace(kiln::vision::Cifar10Dataset::from_files({path}, records)); }))
    return 0;
  if (set->size() != records) kiln::fuzz::fail("CIFAR-10: the wrong number of records");
  for (std::int64_t r = 0; r < records; ++r) {
    const std::uint8_t* record = data + r * cifar10::kRecordBytes;
    if (set->label(r) != record[0] || std::memcmp(set->image(r), record + 1, cifar10::kImageBytes) != 0)
      kiln::fuzz::fail("CIFAR-10: record " + std::to_string(r) + " was not read as written");
  }
  return 0;
}
