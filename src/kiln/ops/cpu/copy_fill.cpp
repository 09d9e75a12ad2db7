// CPU copy (with dtype conversion), fill, arange and random.
#include <cstring>

#include "kiln/ops/cpu/cpu_kernels.h"
#include "kiln/ops/cpu/parallel.h"
#include "kiln/ops/cpu/strided_loop.h"
#include "kiln/ops/philox.h"

namespace kiln::ops::cpu {

namespace {
template <class Dst, class Src>
inline Dst convert(Src v) {
  if constexpr (std::is_same_v<Dst, bool>) {
    return static_cast<float>(v) != 0.0f;
  } else if constexpr (std::is_same_v<Src, double> || std::is_same_v<Src, std::int64_t> ||
                       std::is_same_v<Src, std::int32_t>) {
    if constexpr (std::is_arithmetic_v<Dst>)
      return static_cast<Dst>(v);
    else
      return Dst(static_cast<float>(v));
  } else if constexpr (std::is_arithmetic_v<Src> && std::is_arithmetic_v<Dst>) {
    return static_cast<Dst>(v);
  } else if constexpr (std::is_arithmetic_v<Dst>) {
    return static_cast<Dst>(static_cast<float>(v));
  } else {
    return Dst(static_cast<float>(v));
  }
}
}  // namespace

void copy(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    std::memmove(dst.data_ptr(), src.data_ptr(), src.nbytes());
    return;
  }
  auto layout = coalesce<2>(dst.shape(), {&dst.strides(), &src.strides()});
  KILN_DISPATCH_ALL(dst.dtype(), "copy", [&]<class D>() {
    KILN_DISPATCH_ALL(src.dtype(), "copy", [&]<class S>() {
      D* d = static_cast<D*>(dst.data_ptr());
      const S* s = static_cast<const S*>(src.data_ptr());
      for_each_row(layout, [&](auto off, std::int64_t n, auto st) {
        D* dp = d + off[0];
        const S* sp = s + off[1];
        for (std::int64_t i = 0; i < n; ++i) dp[i * st[0]] = convert<D>(sp[i * st[1]]);
      });
    });
  });
}

void accumulate(const Tensor& acc, const Tensor& src) {
  KILN_CHECK(acc.dtype() == DType::F32 || acc.dtype() == DType::F64,
             "accumulate: the accumulator must be float32 or float64, got {}", acc.describe());
  auto layout = coalesce<2>(acc.shape(), {&acc.strides(), &src.strides()});
  auto add = [&]<class D>() {
    KILN_DISPATCH_FLOATING(src.dtype(), "accumulate", [&]<class S>() {
      D* d = static_cast<D*>(acc.data_ptr());
      const S* s = static_cast<const S*>(src.data_ptr());
      for_each_row(layout, [&](auto off, std::int64_t n, auto st) {
        D* dp = d + off[0];
        const S* sp = s + off[1];
        for (std::int64_t i = 0; i < n; ++i) dp[i * st[0]] += convert<D>(sp[i * st[1]]);
      });
    });
  };
  if (acc.dtype() == DType::F64)
    add.template operator()<double>();
  else
    add.template operator()<float>();
}

void fill(const Tensor& dst, double value) {
  auto layout = coalesce<1>(dst.shape(), {&dst.strides()});
  KILN_DISPATCH_ALL(dst.dtype(), "fill", [&]<class D>() {
    D v = convert<D>(value);
    D* d = static_cast<D*>(dst.data_ptr());
    for_each_row(layout, [&](auto off, std::int64_t n, auto st) {
      for (std::int64_t i = 0; i < n; ++i) d[off[0] + i * st[0]] = v;
    });
  });
}

void arange(const Tensor& dst, double start, double step) {
  KILN_DISPATCH_NUMERIC(dst.dtype(), "arange", [&]<class D>() {
    D* d = static_cast<D*>(dst.data_ptr());
    for (std::int64_t i = 0; i < dst.numel(); ++i) d[i] = convert<D>(start + step * static_cast<double>(i));
  });
}

void random(const Tensor& dst, RandomKind kind, std::uint64_t seed, std::uint64_t offset, double a, double b) {
  KILN_DISPATCH_FLOATING(dst.dtype(), "random", [&]<class D>() {
    D* d = static_cast<D*>(dst.data_ptr());
    // Every element is a function of (seed, offset + i) alone (counter-based Philox), so the threads'
    // split changes nothing; one thread took ~50 s for a 1.3B model's initial weights.
    parallel_for(dst.numel(), 1 << 16, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) {
        const std::uint64_t idx = offset + static_cast<std::uint64_t>(i);
        float v = 0;
        switch (kind) {
          case RandomKind::Uniform: v = static_cast<float>(a + (b - a) * random_uniform(seed, idx)); break;
          case RandomKind::Normal: v = static_cast<float>(a + b * random_normal(seed, idx)); break;
          case RandomKind::Bernoulli: v = random_uniform(seed, idx) < a ? 1.0f : 0.0f; break;
        }
        d[i] = convert<D>(v);
      }
    });
  });
}

void random_device_offset(const Tensor& dst, RandomKind kind, std::uint64_t seed, const Tensor& offset, double a,
                          double b) {
  KILN_CHECK(offset.dtype() == DType::I64 && offset.numel() == 1,
             "random_device_offset: offset must be an int64 scalar, got {}", offset.describe());
  random(dst, kind, seed, static_cast<std::uint64_t>(*offset.data<std::int64_t>()), a, b);
}

}  // namespace kiln::ops::cpu
