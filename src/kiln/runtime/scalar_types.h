#pragma once
// Host-side storage types for the reduced-precision dtypes. Each is the bit pattern only, layout
// compatible with CUDA's __nv_bfloat16 / __half / __nv_fp8_*, so device kernels reinterpret the
// same buffers. Conversions round to nearest even, as the hardware does.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif

namespace kiln {

KILN_HD inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
KILN_HD inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct BFloat16 {
  std::uint16_t bits = 0;
  BFloat16() = default;
  KILN_HD explicit BFloat16(float f) {
    std::uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN
      bits = static_cast<std::uint16_t>((u >> 16) | 0x40);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
      bits = static_cast<std::uint16_t>(u >> 16);
    }
  }
  KILN_HD operator float() const { return bits_float(static_cast<std::uint32_t>(bits) << 16); }
};

struct Half {
  std::uint16_t bits = 0;
  Half() = default;
  KILN_HD explicit Half(float f) { bits = from_float(f); }
  KILN_HD operator float() const { return to_float(bits); }

  KILN_HD static std::uint16_t from_float(float f) {
    std::uint32_t x = float_bits(f);
    std::uint32_t sign = (x >> 16) & 0x8000u;
    std::uint32_t abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
    if (abs < 0x38800000u) {  // subnormal or zero in half: let float addition do the rounding
      float a = bits_float(abs) + 0.5f;
      return static_cast<std::uint16_t>(sign | (float_bits(a) - 0x3f000000u));
    }
    std::uint32_t mant_odd = (abs >> 13) & 1u;
    abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
    return static_cast<std::uint16_t>(sign | (abs >> 13));
  }
  KILN_HD static float to_float(std::uint16_t h) {
    std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
      float m = static_cast<float>(mant) * (1.0f / 16777216.0f);  // 2^-24
      return sign ? -m : m;
    }
    return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
  }
};

// FP8 (OCP formats, as on Hopper): E4M3 has no infinities (max 448, 0x7f is NaN); E5M2 is IEEE-like.
// Conversions saturate to the largest finite value, as TransformerEngine's casts do.
template <int kExpBits, int kMantBits, bool kHasInf>
struct Float8 {
  std::uint8_t bits = 0;
  Float8() = default;
  KILN_HD explicit Float8(float f) { bits = from_float(f); }
  KILN_HD operator float() const { return to_float(bits); }

  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  KILN_HD static float max_finite() { return kHasInf ? 57344.0f : 448.0f; }

  KILN_HD static float to_float(std::uint8_t b) {
    std::uint32_t sign = (b >> 7) & 1u;
    std::uint32_t exp = (b >> kMantBits) & ((1u << kExpBits) - 1);
    std::uint32_t mant = b & ((1u << kMantBits) - 1);
    float v;
    if (kHasInf && exp == (1u << kExpBits) - 1) {
      v = mant ? NAN : INFINITY;
    } else if (!kHasInf && exp == (1u << kExpBits) - 1 && mant == (1u << kMantBits) - 1) {
      v = NAN;
    } else if (exp == 0) {
      v = std::ldexp(static_cast<float>(mant), 1 - kBias - kMantBits);
    } else {
      v = std::ldexp(1.0f + static_cast<float>(mant) / (1 << kMantBits), static_cast<int>(exp) - kBias);
    }
    return sign ? -v : v;
  }

  KILN_HD static std::uint8_t from_float(float f) {
    if (std::isnan(f)) return kHasInf ? 0x7f : 0x7f;
    std::uint8_t sign = std::signbit(f) ? 0x80 : 0;
    float a = std::fabs(f);
    if (a >= max_finite()) return static_cast<std::uint8_t>(sign | from_positive(max_finite()));
    return static_cast<std::uint8_t>(sign | from_positive(a));
  }

 private:
  KILN_HD static std::uint8_t from_positive(float a) {
    // Scale into the format's integer grid at a's binade and round to nearest even.
    int e = 0;
    if (a == 0.0f) return 0;
    std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    int exp = e - 1 + kBias;
    if (exp < 1) exp = 1;  // subnormals share the smallest normal binade's step
    float step = std::ldexp(1.0f, exp - kBias - kMantBits);
    float q = std::nearbyint(a / step);  // nearest even under the default rounding mode
    std::uint32_t units = static_cast<std::uint32_t>(q);
    // units counts steps from 0 in this binade's spacing; re-encode (may carry into the exponent).
    std::uint32_t biased = static_cast<std::uint32_t>(exp);
    if (units >= (2u << kMantBits)) {
      units >>= 1;
      ++biased;
    }
    if (units < (1u << kMantBits)) return static_cast<std::uint8_t>(units);  // subnormal
    return static_cast<std::uint8_t>((biased << kMantBits) | (units - (1u << kMantBits)));
  }
};

using Float8E4M3 = Float8<4, 3, false>;
using Float8E5M2 = Float8<5, 2, true>;

}  // namespace kiln
