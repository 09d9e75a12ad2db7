#pragma once
// HPL's pseudo-random matrix generator (HPL_pdmatgen / HPL_rand): a 64-bit linear congruential
// sequence X(k+1) = a X(k) + c mod 2^64 with a = 6364136223846793005, c = 1, started at
// X(0) = a * seed + c. Entry (i, j) of the N x (N+1) matrix [A | b] is number i + j*N of the
// sequence, mapped to (-0.5, 0.5] as 0.5 - X / 2^64. Jump-ahead makes any entry computable
// directly, so every process (and every GPU thread) generates its own part and the matrix is
// the same as HPL's for the same N and seed whatever the grid.
#include <cstdint>

#if defined(__CUDACC__)
#define KILN_HPL_HOST_DEVICE __host__ __device__
#else
#define KILN_HPL_HOST_DEVICE
#endif

namespace kiln::hpl {

// x -> mul * x + add (mod 2^64): one step, or a jump of many steps, of the sequence.
struct AffineStep {
  std::uint64_t mul = 1;
  std::uint64_t add = 0;

  KILN_HPL_HOST_DEVICE std::uint64_t apply(std::uint64_t x) const { return mul * x + add; }
  // `this` after `first`.
  KILN_HPL_HOST_DEVICE AffineStep after(const AffineStep& first) const {
    return {mul * first.mul, mul * first.add + add};
  }
};

inline constexpr std::uint64_t kHplMultiplier = (std::uint64_t{1481765933} << 32) | 1284865837u;  // HPL_MULT1:MULT0
inline constexpr std::uint64_t kHplIncrement = 1;                                                 // HPL_IADD1:IADD0

// The step that advances the sequence by `count` numbers (square-and-multiply, 64 steps at most).
KILN_HPL_HOST_DEVICE inline AffineStep hpl_jump(std::uint64_t count) {
  AffineStep result;  // identity
  AffineStep power{kHplMultiplier, kHplIncrement};
  while (count != 0) {
    if (count & 1) result = power.after(result);
    power = power.after(power);
    count >>= 1;
  }
  return result;
}

// HPL_rand's mapping of a state to a number in (-0.5, 0.5]: 0.5 - (hi + lo / 2^32) / 2^32, with the
// same rounding as HPL (the sum is exact before its one rounding, the scalings are powers of two).
KILN_HPL_HOST_DEVICE inline double hpl_value(std::uint64_t x) {
  double lo = static_cast<double>(static_cast<std::uint32_t>(x)) / 2147483648.0 * 0.5;
  double hi = static_cast<double>(static_cast<std::uint32_t>(x >> 32));
  return 0.5 - (lo + hi) / 2147483648.0 * 0.5;
}

// The state of the first number, X(0), for a seed.
KILN_HPL_HOST_DEVICE inline std::uint64_t hpl_first_state(std::uint32_t seed) {
  return kHplMultiplier * static_cast<std::uint64_t>(seed) + kHplIncrement;
}

// The state of entry (i, j) of an n-row matrix generated column by column.
KILN_HPL_HOST_DEVICE inline std::uint64_t hpl_state_at(std::uint32_t seed, std::uint64_t n, std::uint64_t i,
                                                       std::uint64_t j) {
  return hpl_jump(i + j * n).apply(hpl_first_state(seed));
}

}  // namespace kiln::hpl
