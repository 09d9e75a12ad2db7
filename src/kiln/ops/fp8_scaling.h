#pragma once
// The arithmetic of FP8 scaling, written once for the CPU kernels and the CUDA kernels so both
// produce the same bits: every step is one IEEE single-precision operation rounded to nearest
// (the CUDA side spells them as __fmul_rn / __fdiv_rn / __frcp_rn so no compiler flag can turn
// them into approximations or fused operations).
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kiln/runtime/scalar_types.h"

namespace kiln::ops::fp8 {

KILN_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

KILN_HD inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// scale_inv = 1 / scale, correctly rounded.
KILN_HD inline float reciprocal(float scale) { return div_rn(1.0f, scale); }

// TransformerEngine's compute_scale_from_amax (also DeepSeek-V3's block scales): the factor that
// maps amax onto the format's largest finite value. amax below `epsilon` counts as epsilon; a zero
// or infinite amax gives scale 1; a scale that overflows f32 becomes FLT_MAX; with power_of_two
// the scale is rounded down to a power of two (mantissa bits cleared), so scaling is exact.
KILN_HD inline float scale_from_amax(float amax, float max_fp8, bool power_of_two, float epsilon) {
  if (amax < epsilon) amax = epsilon;
  if (amax == 0.0f || std::isinf(amax)) return 1.0f;
  float scale = div_rn(max_fp8, amax);
  if (std::isinf(scale)) scale = FLT_MAX;
  if (power_of_two) scale = bits_float(float_bits(scale) & 0xff800000u);
  return scale;  // NaN when amax is NaN, as in TransformerEngine
}

// |v| as the amax reduction sees it (NaN propagates through fmaxf as "ignored", as CUDA's does).
KILN_HD inline float abs_value(float v) { return std::fabs(v); }

}  // namespace kiln::ops::fp8
