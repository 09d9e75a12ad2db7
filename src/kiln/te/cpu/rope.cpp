// CPU kernel of apply_rope: rotate-half RoPE on [B, T, H, D] rows, f32 (f64 at f64) math; x may
// be strided (unit stride along D), out is contiguous.
#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/parallel.h"
#include "kiln/te/cpu/rope_head.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te::cpu {

using ops::cpu::acc_t;

void apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, std::int64_t position_offset, bool inverse,
                const Tensor& out) {
  const std::int64_t b = x.shape()[0], t = x.shape()[1], h = x.shape()[2], d = x.shape()[3];
  const std::int64_t half = cos.shape()[1];  // rotated pairs; channels 2 * half.. pass through
  // x may be a strided view (q or k split from a fused projection) with unit stride along D.
  const std::int64_t sb = x.stride(0), st = x.stride(1), sh = x.stride(2);
  const float* cp = static_cast<const float*>(cos.data_ptr());
  const float* sp = static_cast<const float*>(sin.data_ptr());
  KILN_DISPATCH_FLOATING(x.dtype(), "apply_rope", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    const A sign = inverse ? A(-1) : A(1);
    ops::cpu::parallel_for(b * t, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(h * d, 1)),
                           [&](std::int64_t lo, std::int64_t hi) {
                             for (std::int64_t bt = lo; bt < hi; ++bt) {
                               const std::int64_t pos = position_offset + bt % t;
                               const T* row = xp + (bt / t) * sb + (bt % t) * st;
                               const float* c = cp + pos * half;
                               const float* s = sp + pos * half;
                               for (std::int64_t head = 0; head < h; ++head)
                                 rope_head(row + head * sh, c, s, half, d, sign, op + (bt * h + head) * d);
                             }
                           });
  });
}

}  // namespace kiln::te::cpu
