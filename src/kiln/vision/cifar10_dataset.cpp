#include "kiln/vision/cifar10_dataset.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <system_error>

#include "kiln/runtime/error.h"
#include "kiln/vision/cifar10_format.h"

namespace kiln::vision {

namespace fs = std::filesystem;

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

fs::path batches_folder(const fs::path& data_dir) {
  std::error_code ec;
  fs::path nested = data_dir / cifar10::kBatchesFolder;
  return fs::is_directory(nested, ec) ? nested : data_dir;
}

}  // namespace

Cifar10Dataset::Cifar10Dataset(const fs::path& data_dir, Cifar10Split split) {
  const fs::path dir = batches_folder(data_dir);
  std::vector<fs::path> files;
  if (split == Cifar10Split::Train) {
    for (const auto& f : cifar10::kTrainFiles) files.push_back(dir / f.name);
  } else {
    files.push_back(dir / cifar10::kTestFile.name);
  }
  load(files, cifar10::kRecordsPerBatchFile);
}

Cifar10Dataset Cifar10Dataset::from_files(const std::vector<fs::path>& files, std::int64_t records_per_file) {
  Cifar10Dataset dataset;
  dataset.load(files, records_per_file);
  return dataset;
}

void Cifar10Dataset::load(const std::vector<fs::path>& files, std::int64_t records_per_file) {
  KILN_CHECK(!files.empty() && records_per_file > 0, "Cifar10Dataset: no batch files given");
  const std::int64_t file_bytes = records_per_file * cifar10::kRecordBytes;
  const auto how_to_fix = [](const fs::path& file) {
    return fmt::format("run `kiln data cifar10 --data-dir {}` to fetch CIFAR-10", file.parent_path().string());
  };
  // Check every file before reading any, so the error names the first problem without a long wait.
  for (const auto& file : files) {
    std::error_code ec;
    KILN_CHECK(fs::is_regular_file(file, ec),
               "CIFAR-10 batch file '{}' is missing (expected {} bytes: {} records of {} bytes); {}", file.string(),
               file_bytes, records_per_file, cifar10::kRecordBytes, how_to_fix(file));
    auto size = fs::file_size(file, ec);
    KILN_CHECK(!ec && size == std::uintmax_t(file_bytes),
               "CIFAR-10 batch file '{}' is {} bytes; expected {} bytes ({} records of {} bytes): it is truncated or "
               "not a CIFAR-10 binary batch; {}",
               file.string(), size, file_bytes, records_per_file, cifar10::kRecordBytes, how_to_fix(file));
  }

  size_ = records_per_file * std::int64_t(files.size());
  images_ = allocate_pinned(std::size_t(size_ * kImageBytes));
  labels_.resize(std::size_t(size_));
  auto* images = static_cast<std::uint8_t*>(images_.get());
  std::vector<std::uint8_t> buffer(static_cast<std::size_t>(file_bytes));
  std::int64_t index = 0;
  for (const auto& file : files) {
    std::unique_ptr<std::FILE, FileCloser> in(std::fopen(file.c_str(), "rb"));
    KILN_CHECK(in, "cannot open CIFAR-10 batch file '{}': {}", file.string(), std::strerror(errno));
    KILN_CHECK(std::fread(buffer.data(), 1, buffer.size(), in.get()) == buffer.size(),
               "cannot read {} bytes from CIFAR-10 batch file '{}': it is truncated or unreadable", file_bytes,
               file.string());
    for (std::int64_t r = 0; r < records_per_file; ++r, ++index) {
      const std::uint8_t* record = buffer.data() + r * cifar10::kRecordBytes;
      KILN_CHECK(record[0] < cifar10::kNumClasses,
                 "CIFAR-10 batch file '{}': record {} has label {}; expected 0..9 (not a CIFAR-10 binary batch?)",
                 file.string(), r, int(record[0]));
      labels_[std::size_t(index)] = record[0];
      std::memcpy(images + index * kImageBytes, record + 1, kImageBytes);
    }
  }
}

}  // namespace kiln::vision
