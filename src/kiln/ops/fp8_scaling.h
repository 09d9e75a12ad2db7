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

// One step of TransformerEngine's DelayedScaling (its amax_and_scale_update,
// transformer_engine/common/recipe/delayed_scaling.cu), on one tensor's state. history[0] holds the
// amax the last cast recorded; the amax the new scale follows is history[0] (most_recent) or the
// largest entry of the window (max). The window then rolls one place (history[i] <- history[i + 1],
// history[len - 1] <- history[0]) and history[0] is zeroed for the next cast to write. The scale is
// scaled_max / amax (scaled_max = fp8_max * 2^-margin), kept as it was while amax is 0 or not
// finite; scale_inv = 1 / scale. Written once for the CPU and the CUDA kernel (same bits).
KILN_HD inline void delayed_scaling_step(float* history, std::int64_t len, float* scale, float* scale_inv,
                                         bool most_recent, float scaled_max) {
  const float last = history[0];
  float amax = 0.0f;
  for (std::int64_t i = 0; i < len; ++i) {
    const float a = i < len - 1 ? history[i + 1] : last;  // read before history[i] is written
    amax = std::fmax(amax, a);
    history[i] = i > 0 ? a : 0.0f;
  }
  if (most_recent) amax = last;
  const float s = (std::isfinite(amax) && amax > 0.0f) ? div_rn(scaled_max, amax) : *scale;
  *scale = s;
  *scale_inv = reciprocal(s);
}

// The scale entry of element (r, c) of a [rows, cols] matrix (fp8_scale_index, written once for the
// piece kernels of both backends): `per_tensor`: 0; else 128x128 blocks when `square`, 1x128 tiles
// otherwise, in the layouts fp8_tensor.h describes.
KILN_HD inline std::int64_t scale_entry(bool per_tensor, bool square, std::int64_t rows, std::int64_t cols,
                                        std::int64_t r, std::int64_t c) {
  if (per_tensor) return 0;
  if (square) return (r / 128) * ((((cols + 127) / 128) + 3) / 4 * 4) + c / 128;
  return (c / 128) * ((rows + 3) / 4 * 4) + r;
}

// |v| as the amax reduction sees it (NaN propagates through fmaxf as "ignored", as CUDA's does).
KILN_HD inline float abs_value(float v) { return std::fabs(v); }

}  // namespace kiln::ops::fp8
