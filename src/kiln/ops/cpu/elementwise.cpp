// CPU unary, binary, where and clamp kernels over strided (broadcast) inputs.
#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/cpu_kernels.h"
#include "kiln/ops/cpu/elementwise_math.h"
#include "kiln/ops/cpu/parallel.h"
#include "kiln/ops/cpu/strided_loop.h"

namespace kiln::ops::cpu {

namespace {

// Calls fn.template operator()<Op>() with `op` as a compile-time constant, so the per-element
// switch in unary_value/unary_derivative folds away and the loop vectorises.
template <class Fn>
void with_unary_op(UnaryOp op, Fn&& fn) {
#define KILN_UNARY_CASE(O) \
  case UnaryOp::O: return fn.template operator()<UnaryOp::O>();
  switch (op) {
    KILN_UNARY_CASE(Neg)
    KILN_UNARY_CASE(Abs)
    KILN_UNARY_CASE(Exp)
    KILN_UNARY_CASE(Log)
    KILN_UNARY_CASE(Sqrt)
    KILN_UNARY_CASE(Rsqrt)
    KILN_UNARY_CASE(Square)
    KILN_UNARY_CASE(Reciprocal)
    KILN_UNARY_CASE(Sin)
    KILN_UNARY_CASE(Cos)
    KILN_UNARY_CASE(Relu)
    KILN_UNARY_CASE(Gelu)
    KILN_UNARY_CASE(GeluTanh)
    KILN_UNARY_CASE(Silu)
    KILN_UNARY_CASE(Sigmoid)
    KILN_UNARY_CASE(Tanh)
    KILN_UNARY_CASE(PowScalar)
    KILN_UNARY_CASE(LeakyRelu)
  }
#undef KILN_UNARY_CASE
}

constexpr std::int64_t kElementwiseGrain = 1 << 16;

}  // namespace

void unary(UnaryOp op, const Tensor& in, const Tensor& out, double param) {
  auto layout = coalesce<2>(out.shape(), {&out.strides(), &in.strides()});
  KILN_DISPATCH_NUMERIC(out.dtype(), "unary", [&]<class T>() {
    using A = acc_t<T>;
    T* o = static_cast<T*>(out.data_ptr());
    const T* x = static_cast<const T*>(in.data_ptr());
    const A p = static_cast<A>(param);
    if (in.is_contiguous() && out.is_contiguous()) {  // flat, op hoisted out of the loop, threaded
      with_unary_op(op, [&]<UnaryOp Op>() {
        parallel_for(out.numel(), kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
          for (std::int64_t i = lo; i < hi; ++i) o[i] = from_acc<T>(unary_value<A>(Op, static_cast<A>(x[i]), p));
        });
      });
      return;
    }
    for_each_row(layout, [&](auto off, std::int64_t n, auto st) {
      for (std::int64_t i = 0; i < n; ++i)
        o[off[0] + i * st[0]] = from_acc<T>(unary_value<A>(op, static_cast<A>(x[off[1] + i * st[1]]), p));
    });
  });
}

void unary_backward(UnaryOp op, const Tensor& grad_out, const Tensor& in, const Tensor& out, const Tensor& grad_in,
                    double param) {
  auto layout = coalesce<4>(grad_in.shape(), {&grad_in.strides(), &grad_out.strides(), &in.strides(), &out.strides()});
  KILN_DISPATCH_FLOATING(grad_in.dtype(), "unary_backward", [&]<class T>() {
    using A = acc_t<T>;
    T* gi = static_cast<T*>(grad_in.data_ptr());
    const T* go = static_cast<const T*>(grad_out.data_ptr());
    const T* x = static_cast<const T*>(in.data_ptr());
    const T* y = static_cast<const T*>(out.data_ptr());
    const A p = static_cast<A>(param);
    if (grad_in.is_contiguous() && grad_out.is_contiguous() && in.is_contiguous() && out.is_contiguous()) {
      with_unary_op(op, [&]<UnaryOp Op>() {
        parallel_for(grad_in.numel(), kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
          for (std::int64_t i = lo; i < hi; ++i)
            gi[i] =
                from_acc<T>(unary_grad<A>(Op, static_cast<A>(go[i]), static_cast<A>(x[i]), static_cast<A>(y[i]), p));
        });
      });
      return;
    }
    for_each_row(layout, [&](auto off, std::int64_t n, auto st) {
      for (std::int64_t i = 0; i < n; ++i) {
        A xv = static_cast<A>(x[off[2] + i * st[2]]);
        A yv = static_cast<A>(y[off[3] + i * st[3]]);
        gi[off[0] + i * st[0]] = from_acc<T>(unary_grad<A>(op, static_cast<A>(go[off[1] + i * st[1]]), xv, yv, p));
      }
    });
  });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  auto layout = coalesce<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()});
  KILN_DISPATCH_NUMERIC(a.dtype(), "binary", [&]<class T>() {
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(a.data_ptr());
    const T* y = static_cast<const T*>(b.data_ptr());
    auto run = [&]<class O>(O* o) {
      for_each_row(layout, [&](auto off, std::int64_t n, auto st) {
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {  // contiguous row: let the compiler vectorise
          O* op_ = o + off[0];
          const T* xp = x + off[1];
          const T* yp = y + off[2];
          for (std::int64_t i = 0; i < n; ++i)
            op_[i] = from_acc<O>(binary_value<A>(op, static_cast<A>(xp[i]), static_cast<A>(yp[i])));
          return;
        }
        for (std::int64_t i = 0; i < n; ++i)
          o[off[0] + i * st[0]] = from_acc<O>(
              binary_value<A>(op, static_cast<A>(x[off[1] + i * st[1]]), static_cast<A>(y[off[2] + i * st[2]])));
      });
    };
    if (out.dtype() == DType::Bool)
      run(static_cast<bool*>(out.data_ptr()));
    else
      run(static_cast<T*>(out.data_ptr()));
  });
}

void binary_scalar(BinaryOp op, const Tensor& a, double scalar, const Tensor& out) {
  auto layout = coalesce<2>(out.shape(), {&out.strides(), &a.strides()});
  KILN_DISPATCH_NUMERIC(a.dtype(), "binary_scalar", [&]<class T>() {
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(a.data_ptr());
    const A s = static_cast<A>(scalar);
    auto run = [&]<class O>(O* o) {
      for_each_row(layout, [&](auto off, std::int64_t n, auto st) {
        for (std::int64_t i = 0; i < n; ++i)
          o[off[0] + i * st[0]] = from_acc<O>(binary_value<A>(op, static_cast<A>(x[off[1] + i * st[1]]), s));
      });
    };
    if (out.dtype() == DType::Bool)
      run(static_cast<bool*>(out.data_ptr()));
    else
      run(static_cast<T*>(out.data_ptr()));
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  auto layout = coalesce<4>(out.shape(), {&out.strides(), &cond.strides(), &a.strides(), &b.strides()});
  KILN_DISPATCH_ALL(out.dtype(), "where", [&]<class T>() {
    T* o = static_cast<T*>(out.data_ptr());
    const bool* c = static_cast<const bool*>(cond.data_ptr());
    const T* x = static_cast<const T*>(a.data_ptr());
    const T* y = static_cast<const T*>(b.data_ptr());
    for_each_row(layout, [&](auto off, std::int64_t n, auto st) {
      for (std::int64_t i = 0; i < n; ++i)
        o[off[0] + i * st[0]] = c[off[1] + i * st[1]] ? x[off[2] + i * st[2]] : y[off[3] + i * st[3]];
    });
  });
}

void clamp(const Tensor& in, double lo, double hi, const Tensor& out) {
  auto layout = coalesce<2>(out.shape(), {&out.strides(), &in.strides()});
  KILN_DISPATCH_NUMERIC(out.dtype(), "clamp", [&]<class T>() {
    using A = acc_t<T>;
    T* o = static_cast<T*>(out.data_ptr());
    const T* x = static_cast<const T*>(in.data_ptr());
    for_each_row(layout, [&](auto off, std::int64_t n, auto st) {
      for (std::int64_t i = 0; i < n; ++i) {
        A v = static_cast<A>(x[off[1] + i * st[1]]);
        v = v < static_cast<A>(lo) ? static_cast<A>(lo) : (v > static_cast<A>(hi) ? static_cast<A>(hi) : v);
        o[off[0] + i * st[0]] = from_acc<T>(v);
      }
    });
  });
}

}  // namespace kiln::ops::cpu
