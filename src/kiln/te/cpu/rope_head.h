#pragma once
// The rotate-half RoPE of one head on the CPU, shared by the kernels of apply_rope and
// split_qkv_rope so that both round alike: the fused op's results equal the unfused path's bit for
// bit only while the per-element expressions are the same ones.
#include <cstdint>

#include "kiln/ops/cpu/accumulate_type.h"

namespace kiln::te::cpu {

// out[i], out[i + half] = rotate-half of (in[i], in[i + half]) by the angle of (cos, sign * sin),
// i < half, in the accumulation type (f32; f64 at f64); channels 2 * half .. d are copied.
template <class T>
inline void rope_head(const T* in, const float* cos, const float* sin, std::int64_t half, std::int64_t d,
                      ops::cpu::acc_t<T> sign, T* out) {
  using A = ops::cpu::acc_t<T>;
  for (std::int64_t i = 0; i < half; ++i) {
    const A x1 = static_cast<A>(in[i]), x2 = static_cast<A>(in[i + half]);
    const A ci = static_cast<A>(cos[i]), si = sign * static_cast<A>(sin[i]);
    out[i] = ops::cpu::from_acc<T>(x1 * ci - x2 * si);
    out[i + half] = ops::cpu::from_acc<T>(x2 * ci + x1 * si);
  }
  for (std::int64_t i = 2 * half; i < d; ++i) out[i] = in[i];
}

}  // namespace kiln::te::cpu
