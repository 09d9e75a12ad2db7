#pragma once
// Helpers of the te/ tests: random float64 inputs, comparisons, and the CUDA device when there is
// one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kiln/runtime/backend.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te_test {

inline Tensor randn(Shape s, std::uint64_t seed, double scale = 1, double shift = 0) {
  Tensor t = Tensor::randn(std::move(s), seed, DType::F64);
  if (scale != 1) t.mul_(scale);
  if (shift != 0) t.add_(Tensor::full(t.shape(), shift, DType::F64));
  return t;
}

// max |a - b| / max(max |b|, tiny): an error relative to the reference's scale.
inline double rel_error(const Tensor& got, const Tensor& want) {
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  EXPECT_EQ(g.size(), w.size());
  double err = 0, scale = 1e-300;
  for (std::size_t i = 0; i < std::min(g.size(), w.size()); ++i) {
    err = std::max(err, std::abs(g[i] - w[i]));
    scale = std::max(scale, std::abs(w[i]));
  }
  return err / scale;
}

inline std::optional<Device> cuda_device() {
  if (device_count(DeviceKind::CUDA) == 0) return std::nullopt;
  return Device::cuda(0);
}

// The CUDA-vs-CPU bound for float32 results that pass through GEMMs: true FP32 by default, TF32
// (10-bit mantissa) when KILN_ALLOW_TF32 is set, as ops/cuda/cuda_host.h reads it.
inline double f32_gemm_tolerance() {
  const char* v = std::getenv("KILN_ALLOW_TF32");
  const bool tf32 = v && v[0] != '\0' && std::strcmp(v, "0") != 0;
  return tf32 ? 5e-3 : 1e-4;
}

// Normalised error sum((a - b)^2) / sum(b^2) over the finite entries of b (infinite entries must
// match exactly).
inline double nmse(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double e = 0, n = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::isinf(b[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    e += (a[i] - b[i]) * (a[i] - b[i]);
    n += b[i] * b[i];
  }
  return e / std::max(n, 1e-300);
}

// Sets an environment variable for a scope, restoring the previous value (or its absence).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

#define KILN_TE_REQUIRE_CUDA(var)                        \
  const auto var##_opt = ::kiln::te_test::cuda_device(); \
  if (!var##_opt) GTEST_SKIP() << "no CUDA device";      \
  const ::kiln::Device var = *var##_opt

// Runs `f` and expects a kiln::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, std::vector<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning " << parts.front();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

}  // namespace kiln::te_test
