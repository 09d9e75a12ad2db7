#pragma once
// Philox-4x32-10 (Salmon et al., SC'11): a counter-based generator, so element i of a random
// tensor depends only on (seed, i) and the CPU and GPU produce identical numbers.
#include <cmath>
#include <cstdint>

#include "kiln/runtime/scalar_types.h"  // KILN_HD

namespace kiln::ops {

struct Philox4 {
  std::uint32_t v[4];
};

KILN_HD inline void philox_mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}

KILN_HD inline Philox4 philox4x32_10(std::uint64_t counter, std::uint64_t seed) {
  std::uint32_t c0 = static_cast<std::uint32_t>(counter), c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = 0, c3 = 0;
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    std::uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 random bits (exactly representable in float).
KILN_HD inline float philox_uniform(std::uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }

// Element i's value: one Philox call per element (simple and identical everywhere).
KILN_HD inline float random_uniform(std::uint64_t seed, std::uint64_t index) {
  return philox_uniform(philox4x32_10(index, seed).v[0]);
}

// Double arithmetic that is never contracted into FMAs, so host and device round identically
// (host code is compiled without FMA contraction: ISO C++ mode, and x86-64 has no FMA by default).
KILN_HD inline double philox_dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
KILN_HD inline double philox_dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
KILN_HD inline double philox_ddiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// log(u) for u in (0, 1] (a normal float), from +, *, / only: bit-identical on every backend.
KILN_HD inline double philox_log(float u) {
  std::uint32_t bits = float_bits(u);
  int e = static_cast<int>((bits >> 23) & 0xffu) - 127;
  double m = static_cast<double>(bits_float((bits & 0x007fffffu) | 0x3f800000u));  // [1, 2)
  if (m > 1.4142135623730951) {
    m = philox_dmul(m, 0.5);
    ++e;
  }
  // log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716: 12 odd terms reach double precision.
  double s = philox_ddiv(philox_dadd(m, -1.0), philox_dadd(m, 1.0));
  double s2 = philox_dmul(s, s);
  double p = 1.0 / 25.0;
  for (int k = 11; k >= 0; --k) p = philox_dadd(philox_dmul(p, s2), 1.0 / (2 * k + 1));
  return philox_dadd(philox_dmul(2.0, philox_dmul(s, p)), philox_dmul(static_cast<double>(e), 0.69314718055994530942));
}

// sin(x) and cos(x) for |x| <= pi/4 by Taylor series (+ and * only).
KILN_HD inline double philox_sin_small(double x) {
  double x2 = philox_dmul(x, x), term = x, sum = x;
  for (int k = 1; k <= 10; ++k) {
    term = philox_dmul(term, philox_ddiv(-x2, static_cast<double>((2 * k) * (2 * k + 1))));
    sum = philox_dadd(sum, term);
  }
  return sum;
}
KILN_HD inline double philox_cos_small(double x) {
  double x2 = philox_dmul(x, x), term = 1.0, sum = 1.0;
  for (int k = 1; k <= 10; ++k) {
    term = philox_dmul(term, philox_ddiv(-x2, static_cast<double>((2 * k - 1) * (2 * k))));
    sum = philox_dadd(sum, term);
  }
  return sum;
}

// cos(2 pi u) for u in [0, 1) on a 2^-24 grid: exact quadrant and octant reduction.
KILN_HD inline double philox_cos_2pi(float u) {
  float t = u * 4.0f;  // exact
  int q = static_cast<int>(t);
  float f = t - static_cast<float>(q);  // exact, in [0, 1)
  constexpr double kHalfPi = 1.5707963267948966;
  bool flip = f > 0.5f;
  double theta = philox_dmul(static_cast<double>(flip ? 1.0f - f : f), kHalfPi);  // <= pi/4
  double c = flip ? philox_sin_small(theta) : philox_cos_small(theta);            // cos(f pi/2)
  double s = flip ? philox_cos_small(theta) : philox_sin_small(theta);            // sin(f pi/2)
  switch (q & 3) {
    case 0: return c;
    case 1: return -s;
    case 2: return -c;
    default: return s;
  }
}

// Element i's normal sample (Box-Muller), computed with the portable log/cos above so that every
// backend produces the same bits.
KILN_HD inline float random_normal(std::uint64_t seed, std::uint64_t index) {
  Philox4 r = philox4x32_10(index, seed);
  // u1 in (0, 1] so the log is finite.
  float u1 = 1.0f - philox_uniform(r.v[0]);
  float u2 = philox_uniform(r.v[1]);
  double radius = philox_dmul(-2.0, philox_log(u1));
#if defined(__CUDA_ARCH__)
  radius = __dsqrt_rn(radius);
#else
  radius = std::sqrt(radius);
#endif
  return static_cast<float>(philox_dmul(radius, philox_cos_2pi(u2)));
}

}  // namespace kiln::ops
