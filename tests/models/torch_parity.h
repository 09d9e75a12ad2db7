#pragma once
// What the PyTorch parity tests of the models share (gpt_parity_test.cpp, mla_mtp_parity_test.cpp):
// finding a Python that imports torch, and the two relative errors they bound.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::models::parity {

inline bool runs(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

// $KILN_PARITY_PYTHON, else /usr/bin/python3 (Debian's torch), else python3 on PATH: the first that
// imports torch, or "".
inline std::string find_torch_python() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("KILN_PARITY_PYTHON")) candidates.push_back(env);
  candidates.push_back("/usr/bin/python3");
  candidates.push_back("python3");
  for (const std::string& python : candidates)
    if (runs(fmt::format("{} -c 'import torch'", python))) return python;
  return "";
}

struct Errors {
  double normwise = 0, max_relative = 0;
};

// ||ours - theirs|| / ||theirs|| and max|ours - theirs| / max|theirs| (absolute errors for a zero reference).
inline Errors relative_errors(const Tensor& ours, const Tensor& theirs) {
  const auto a = ours.to_vector<double>(), b = theirs.to_vector<double>();
  double diff2 = 0, ref2 = 0, max_diff = 0, max_ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] - b[i];
    diff2 += d * d;
    ref2 += b[i] * b[i];
    max_diff = std::max(max_diff, std::abs(d));
    max_ref = std::max(max_ref, std::abs(b[i]));
  }
  if (ref2 == 0) return {std::sqrt(diff2), max_diff};
  return {std::sqrt(diff2 / ref2), max_diff / max_ref};
}

// An empty folder for the running test's files: <build>/parity/<test name>.
inline std::filesystem::path fresh_test_dir() {
  const std::filesystem::path dir = std::filesystem::path(KILN_BINARY_DIR) / "parity" /
                                    ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Token ids [b, t] in [0, vocab), the same for a seed everywhere.
inline Tensor random_ids(std::int64_t b, std::int64_t t, std::int64_t vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(b * t));
  for (auto& id : ids) id = static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(vocab));
  return Tensor::from_vector(ids, {b, t});
}

}  // namespace kiln::models::parity
