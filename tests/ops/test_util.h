#pragma once
// Helpers for the op tests: random inputs, host copies as double, tolerance-aware comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::testing {

// Normal random values rounded to `dtype` (so the reference sees exactly what the op sees).
inline Tensor randn(Shape s, std::uint64_t seed, DType dtype) {
  return Tensor::randn(std::move(s), seed, DType::F64).to(dtype);
}

inline std::vector<double> host(const Tensor& t) { return t.to_vector<double>(); }

// Tolerances per dtype for results computed in a different order than the reference.
inline double tol(DType d) {
  switch (d) {
    case DType::F64: return 1e-10;
    case DType::F32: return 2e-5;
    default: return 2e-2;
  }
}

inline void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    if (!(err <= tolerance * (1.0 + std::abs(want[i]))) && reported++ < 5)
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i];
  }
}

inline void expect_close(const Tensor& got, const std::vector<double>& want, double tolerance,
                         const std::string& what) {
  expect_close(host(got), want, tolerance, what);
}

inline std::vector<DType> float_dtypes() { return {DType::F64, DType::F32, DType::BF16}; }

}  // namespace kiln::testing
