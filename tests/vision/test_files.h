#pragma once
// Helpers for the vision tests: scratch folders and small CIFAR-format batch files written by the
// tests themselves, so no test needs the real data or the network.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace kiln::vision::testing {

// A fresh, empty folder under the build tree, named after the running test.
inline std::filesystem::path scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::path(KILN_BINARY_DIR) / "test_scratch" / "vision" /
             (std::string(info->test_suite_name()) + "." + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Writes `records` CIFAR records (label byte + 3072 pixel bytes) with random pixels and labels
// (first_label + i) % 10; returns the bytes written.
inline std::vector<std::uint8_t> write_cifar_batch(const std::filesystem::path& file, int records, unsigned seed,
                                                   int first_label = 0) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(records) * 3073);
  for (int i = 0; i < records; ++i) {
    bytes[std::size_t(i) * 3073] = static_cast<std::uint8_t>((first_label + i) % 10);
    for (int k = 1; k < 3073; ++k) bytes[std::size_t(i) * 3073 + k] = static_cast<std::uint8_t>(rng() & 0xff);
  }
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return bytes;
}

// A file of `bytes` zero bytes that takes no disk space (a full-size batch of label-0 black images).
inline void write_sparse_file(const std::filesystem::path& file, std::uintmax_t bytes) {
  std::ofstream(file, std::ios::binary).close();
  std::filesystem::resize_file(file, bytes);
}

// EXPECT_CONTAINS(text, part): the test fails, showing the text, when `part` is not in it.
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (part) << "' not in: " << (text)

// The text of kiln::Error thrown by `f`, or "" when nothing is thrown.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace kiln::vision::testing
