#pragma once
// Philox-4x32-10 (Salmon et al., SC'11): a counter-based generator, so element i of a random
// tensor depends only on (seed, i) and the CPU and GPU produce identical numbers.
#include <cmath>
#include <cstdint>

#include "kiln/tensor/scalar_types.h"  // KILN_HD

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

KILN_HD inline float random_normal(std::uint64_t seed, std::uint64_t index) {
  Philox4 r = philox4x32_10(index, seed);
  // Box-Muller; u1 in (0, 1] so the log is finite.
  float u1 = 1.0f - philox_uniform(r.v[0]);
  float u2 = philox_uniform(r.v[1]);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}

}  // namespace kiln::ops
