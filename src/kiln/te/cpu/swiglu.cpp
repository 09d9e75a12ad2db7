// CPU kernels of swiglu: out = silu(gate) * up on rows of [gate | up].
#include <cmath>
#include <vector>

#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/parallel.h"
#include "kiln/te/cpu/fp8_sink.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te::cpu {

using ops::cpu::acc_t;
using ops::cpu::from_acc;

void swiglu_forward(const Tensor& x, const Tensor& out) {
  const std::int64_t f = out.shape().back(), rows = f ? out.numel() / f : 0;
  KILN_DISPATCH_FLOATING(x.dtype(), "swiglu", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    ops::cpu::parallel_for(
        rows, std::max<std::int64_t>(1, 8192 / std::max<std::int64_t>(f, 1)), [&](std::int64_t lo, std::int64_t hi) {
          for (std::int64_t r = lo; r < hi; ++r)
            for (std::int64_t i = 0; i < f; ++i) {
              const A g = static_cast<A>(xp[r * 2 * f + i]), u = static_cast<A>(xp[r * 2 * f + f + i]);
              op[r * f + i] = from_acc<T>(g / (A(1) + std::exp(-g)) * u);
            }
        });
  });
}

// The FP8-output form: each output rounded to x's dtype, then cast (te/cpu/fp8_sink.h).
void swiglu_fp8_forward(const Tensor& x, const Fp8Tensor& out8) {
  const std::int64_t f = out8.cols(), rows = out8.rows();
  const Fp8Sink sink(out8);
  std::vector<float> row_amax(static_cast<std::size_t>(rows), 0.0f);
  KILN_DISPATCH_FLOATING(x.dtype(), "swiglu", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    ops::cpu::parallel_for(
        rows, std::max<std::int64_t>(1, 8192 / std::max<std::int64_t>(f, 1)), [&](std::int64_t lo, std::int64_t hi) {
          for (std::int64_t r = lo; r < hi; ++r) {
            float amax = 0.0f;
            for (std::int64_t i = 0; i < f; ++i) {
              const A g = static_cast<A>(xp[r * 2 * f + i]), u = static_cast<A>(xp[r * 2 * f + f + i]);
              const T o = from_acc<T>(g / (A(1) + std::exp(-g)) * u);
              amax = std::fmax(amax, sink.put(r * f + i, static_cast<float>(o)));
            }
            row_amax[static_cast<std::size_t>(r)] = amax;
          }
        });
  });
  float amax = 0.0f;
  for (float a : row_amax) amax = std::fmax(amax, a);
  sink.finish(out8, amax);
}

// d gate = dout * up * silu'(gate), silu'(g) = sig(g) (1 + g (1 - sig(g))); d up = dout * silu(gate).
void swiglu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx) {
  const std::int64_t f = dout.shape().back(), rows = f ? dout.numel() / f : 0;
  KILN_DISPATCH_FLOATING(x.dtype(), "swiglu_backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* gp = static_cast<const T*>(dout.data_ptr());
    T* dp = static_cast<T*>(dx.data_ptr());
    ops::cpu::parallel_for(
        rows, std::max<std::int64_t>(1, 8192 / std::max<std::int64_t>(f, 1)), [&](std::int64_t lo, std::int64_t hi) {
          for (std::int64_t r = lo; r < hi; ++r)
            for (std::int64_t i = 0; i < f; ++i) {
              const A g = static_cast<A>(xp[r * 2 * f + i]), u = static_cast<A>(xp[r * 2 * f + f + i]);
              const A d = static_cast<A>(gp[r * f + i]);
              const A sig = A(1) / (A(1) + std::exp(-g));
              dp[r * 2 * f + i] = from_acc<T>(d * u * sig * (A(1) + g * (A(1) - sig)));
              dp[r * 2 * f + f + i] = from_acc<T>(d * g * sig);
            }
        });
  });
}

}  // namespace kiln::te::cpu
