// CPU reductions: for every output element, a loop over the reduced elements (accumulating in
// double for f64/integers, float otherwise; sums of float use double to stay accurate).
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/cpu_kernels.h"
#include "kiln/ops/cpu/strided_loop.h"

namespace kiln::ops::cpu {

namespace {

struct Split {
  Shape outer_shape, inner_shape;
  Strides outer_in, outer_out, inner_in;
  std::int64_t inner_count = 1;
};

Split split_dims(const Tensor& in, std::span<const int> dims, const Tensor& out) {
  Split s;
  for (int d = 0; d < in.dim(); ++d) {
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) {
      s.inner_shape.push_back(in.shape()[d]);
      s.inner_in.push_back(in.strides()[d]);
      s.inner_count *= in.shape()[d];
    } else {
      s.outer_shape.push_back(in.shape()[d]);
      s.outer_in.push_back(in.strides()[d]);
      s.outer_out.push_back(out.strides()[d]);
    }
  }
  return s;
}

// Calls visit(out_offset, in_offset_of_outer) for each output element, then the caller walks inner.
template <class Visit>
void for_each_outer(const Split& s, Visit&& visit) {
  auto layout = coalesce<2>(s.outer_shape, {&s.outer_out, &s.outer_in});
  for_each_row(layout, [&](auto off, std::int64_t n, auto st) {
    for (std::int64_t i = 0; i < n; ++i) visit(off[0] + i * st[0], off[1] + i * st[1]);
  });
}

template <class T, class Fn>
void for_each_inner(const T* base, const StridedLayout<1>& inner, Fn&& fn) {
  for_each_row(inner, [&](auto off, std::int64_t n, auto st) {
    const T* p = base + off[0];
    for (std::int64_t i = 0; i < n; ++i) fn(p[i * st[0]]);
  });
}

}  // namespace

void reduce(ReduceOp op, const Tensor& in, std::span<const int> dims, const Tensor& out) {
  Split s = split_dims(in, dims, out);
  auto inner = coalesce<1>(s.inner_shape, {&s.inner_in});
  KILN_DISPATCH_NUMERIC(in.dtype(), "reduce", [&]<class T>() {
    using A = double;  // sums of float in double: accurate without Kahan
    const T* x = static_cast<const T*>(in.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    for_each_outer(s, [&](std::int64_t out_off, std::int64_t in_off) {
      A acc = 0;
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Mean: acc = 0; break;
        case ReduceOp::Prod: acc = 1; break;
        case ReduceOp::Max: acc = -std::numeric_limits<A>::infinity(); break;
        case ReduceOp::Min: acc = std::numeric_limits<A>::infinity(); break;
      }
      bool nan = false;
      for_each_inner(x + in_off, inner, [&](T v) {
        A a = static_cast<A>(v);
        switch (op) {
          case ReduceOp::Sum:
          case ReduceOp::Mean: acc += a; break;
          case ReduceOp::Prod: acc *= a; break;
          case ReduceOp::Max:
            acc = a > acc ? a : acc;
            nan |= a != a;
            break;
          case ReduceOp::Min:
            acc = a < acc ? a : acc;
            nan |= a != a;
            break;
        }
      });
      if (op == ReduceOp::Mean) acc /= static_cast<A>(s.inner_count);
      if (nan) acc = std::numeric_limits<A>::quiet_NaN();
      o[out_off] = from_acc<T>(acc);
    });
  });
}

void variance(const Tensor& in, std::span<const int> dims, int correction, const Tensor& out) {
  Split s = split_dims(in, dims, out);
  auto inner = coalesce<1>(s.inner_shape, {&s.inner_in});
  KILN_DISPATCH_FLOATING(in.dtype(), "var", [&]<class T>() {
    const T* x = static_cast<const T*>(in.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    for_each_outer(s, [&](std::int64_t out_off, std::int64_t in_off) {
      double sum = 0;
      for_each_inner(x + in_off, inner, [&](T v) { sum += static_cast<double>(v); });
      double mean = sum / static_cast<double>(s.inner_count);
      double sq = 0;
      for_each_inner(x + in_off, inner, [&](T v) {
        double d = static_cast<double>(v) - mean;
        sq += d * d;
      });
      double denom = static_cast<double>(s.inner_count - correction);
      o[out_off] = from_acc<T>(denom > 0 ? sq / denom : std::numeric_limits<double>::quiet_NaN());
    });
  });
}

void arg_reduce(bool is_max, const Tensor& in, int dim, const Tensor& out) {
  int dims[1] = {dim};
  Split s = split_dims(in, dims, out);
  const std::int64_t n = in.shape()[dim];
  const std::int64_t stride = in.strides()[dim];
  KILN_DISPATCH_NUMERIC(in.dtype(), "argmax", [&]<class T>() {
    const T* x = static_cast<const T*>(in.data_ptr());
    auto* o = static_cast<std::int64_t*>(out.data_ptr());
    for_each_outer(s, [&](std::int64_t out_off, std::int64_t in_off) {
      std::int64_t best = 0;
      double best_v = static_cast<double>(x[in_off]);
      for (std::int64_t i = 1; i < n; ++i) {
        double v = static_cast<double>(x[in_off + i * stride]);
        if (best_v != best_v) break;  // NaN wins, as in PyTorch
        if (v != v || (is_max ? v > best_v : v < best_v)) {
          best = i;
          best_v = v;
        }
      }
      o[out_off] = best;
    });
  });
}

}  // namespace kiln::ops::cpu
