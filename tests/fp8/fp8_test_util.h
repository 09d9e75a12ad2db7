#pragma once
// Helpers of the FP8 tests: an FP8 rounding reference that shares no code with the kernels
// (nearest of all 256 decoded codes, ties to the even code, saturating), the exact float64 value
// of an Fp8Tensor, a float64 GEMM reference, and an error-message matcher.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "kiln/ops/fp8.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/fp8_tensor.h"

namespace kiln::fp8test {

inline double decode(DType t, std::uint8_t b) {
  return t == DType::F8E4M3 ? Float8E4M3::to_float(b) : Float8E5M2::to_float(b);
}

// The fp8 code nearest to v: brute force over every finite code; ties go to the code whose last
// mantissa bit is 0 (round half to even); beyond the largest finite value, saturate.
inline std::uint8_t nearest_code(DType t, float v) {
  const double max = t == DType::F8E4M3 ? 448.0 : 57344.0;
  const double x = static_cast<double>(v);
  if (x >= max) return t == DType::F8E4M3 ? 0x7e : 0x7b;
  if (x <= -max) return t == DType::F8E4M3 ? 0xfe : 0xfb;
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 256; ++c) {
    const double d = decode(t, static_cast<std::uint8_t>(c));
    if (!std::isfinite(d)) continue;
    if (std::signbit(d) != std::signbit(x)) continue;  // -0 vs +0 keeps the sign of v
    const double err = std::fabs(d - x);
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<std::uint8_t>(best);
}

inline std::vector<std::uint8_t> bytes(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  std::vector<std::uint8_t> v(h.nbytes());
  if (!v.empty()) std::memcpy(v.data(), h.data_ptr(), v.size());
  return v;
}

inline std::vector<float> floats(const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); }

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Index of the scale of element (r, c), written from the layout's definition in fp8_tensor.h.
inline std::int64_t scale_at(ScalingLayout l, std::int64_t rows, std::int64_t cols, std::int64_t r, std::int64_t c) {
  if (l == ScalingLayout::Block1x128) return (c / 128) * (ceil_div(rows, 4) * 4) + r;
  if (l == ScalingLayout::Block128x128) return (r / 128) * (ceil_div(ceil_div(cols, 128), 4) * 4) + c / 128;
  return 0;
}

// Exact value of every element: fp8 value times its scale_inv (row-major, [rows * cols]).
inline std::vector<double> exact(const Fp8Tensor& q) {
  const auto b = bytes(q.data);
  const auto si = floats(q.scale_inv);
  const std::int64_t R = q.rows(), C = q.cols();
  std::vector<double> v(static_cast<std::size_t>(R * C));
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c)
      v[static_cast<std::size_t>(r * C + c)] =
          decode(q.dtype(), b[static_cast<std::size_t>(r * C + c)]) *
          static_cast<double>(si[static_cast<std::size_t>(scale_at(q.layout, R, C, r, c))]);
  return v;
}

// out[m, n] = sum_k A[m, k] B[n, k] (+ bias[n], then GELU-tanh), and sum_k |A B| for tolerances.
struct GemmRef {
  std::vector<double> value, magnitude;
};
inline GemmRef gemm_ref(const std::vector<double>& a, const std::vector<double>& b, std::int64_t M, std::int64_t N,
                        std::int64_t K, const std::vector<double>& bias, bool gelu) {
  GemmRef r;
  r.value.resize(static_cast<std::size_t>(M * N));
  r.magnitude.resize(static_cast<std::size_t>(M * N));
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0, mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double p = a[static_cast<std::size_t>(m * K + k)] * b[static_cast<std::size_t>(n * K + k)];
        s += p;
        mag += std::fabs(p);
      }
      if (!bias.empty()) s += bias[static_cast<std::size_t>(n)];
      if (gelu) s = 0.5 * s * (1.0 + std::tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
      r.value[static_cast<std::size_t>(m * N + n)] = s;
      r.magnitude[static_cast<std::size_t>(m * N + n)] = mag + std::fabs(s);
    }
  return r;
}

// Runs fn, expects kiln::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error raised (expected one mentioning '" << *parts.begin() << "')";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// Values whose magnitudes span many binades, both signs; a few exact zeros.
inline Tensor spread_values(std::int64_t rows, std::int64_t cols, std::uint64_t seed, double lo_exp, double hi_exp) {
  Tensor u = Tensor::rand({rows, cols}, seed, DType::F64);
  Tensor s = Tensor::rand({rows, cols}, seed + 1, DType::F64);
  auto uv = u.to_vector<double>(), sv = s.to_vector<double>();
  std::vector<float> v(uv.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double mag = std::exp2(lo_exp + (hi_exp - lo_exp) * uv[i]);
    v[i] = i % 97 == 5 ? 0.0f : static_cast<float>(sv[i] < 0.5 ? -mag : mag);
  }
  return Tensor::from_vector(v, {rows, cols});
}

}  // namespace kiln::fp8test
