#pragma once
// Helpers of the trainer tests: a small CIFAR-format dataset written by the test (full-size
// sparse batch files whose first records are learnable), quick CPU training options, a scratch
// folder per test, the text of an error, and a process id that is certainly dead.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kiln/train/image_classifier_trainer.h"
#include "kiln/vision/cifar10_format.h"

namespace kiln::train::testing {

namespace fs = std::filesystem;

inline fs::path scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = fs::path(KILN_BINARY_DIR) / "test_scratch" / "train" /
             (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// <root>/cifar-10-batches-bin with six full-size batch files; the first 256 records of each are
// class-coloured noise (something to learn), the rest zeros (sparse, no disk space). Made once.
inline fs::path small_cifar10() {
  const fs::path root = fs::path(KILN_BINARY_DIR) / "test_scratch" / "train" / "cifar10";
  const fs::path dir = root / vision::cifar10::kBatchesFolder;
  fs::create_directories(dir);
  std::vector<std::string> names = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                    "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
  for (const auto& name : names) {
    if (fs::exists(dir / name)) continue;
    std::string bytes;
    std::mt19937 rng(7);
    for (int i = 0; i < 256; ++i) {
      const int label = i % 10;
      bytes.push_back(static_cast<char>(label));
      for (int k = 0; k < 3072; ++k) bytes.push_back(static_cast<char>((label * 25 + rng() % 40) & 0xff));
    }
    // Per process, then renamed: test processes run in parallel.
    const fs::path tmp = dir / (name + ".partial." + std::to_string(::getpid()));
    std::ofstream(tmp, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    fs::resize_file(tmp, vision::cifar10::kBatchFileBytes);
    fs::rename(tmp, dir / name);
  }
  return root;
}

// Two steps of 32 images per epoch of SimpleCNN on the CPU: a fraction of a second an epoch.
inline ImageClassifierOptions quick_options(const fs::path& out_dir, int epochs) {
  ImageClassifierOptions o;
  o.model = "simple_cnn";
  o.epochs = epochs;
  o.batch_size = 32;
  o.eval_batch_size = 64;
  o.limit_train = 64;
  o.limit_test = 64;
  o.device = Device::cpu();
  o.data_dir = small_cifar10();
  o.out_dir = out_dir;
  o.download = false;
  o.progress = false;
  return o;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (part) << "' not in: " << (text)

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary).write(text.data(), static_cast<std::streamsize>(text.size()));
}

// The id of a process that has exited and been reaped (not reused within a test's lifetime).
inline pid_t dead_pid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

}  // namespace kiln::train::testing
