// CUDA unary, unary_backward, binary, binary_scalar, where and clamp. One kernel template per
// (input dtype, output dtype): the op is a runtime switch (uniform across the launch, a few
// instructions against ~80 per element of memory-bound budget), which keeps compile time low.
// Contiguous operands take a 16-byte vectorised path; broadcast/strided ones use an Indexer.
#include <optional>

#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/cuda_kernels.h"

namespace kiln::ops::cuda {

namespace {

// ---- scalar math (mirrors ops/cpu/elementwise_math.h) ------------------------------------------

template <class A>
__device__ __forceinline__ A unary_value(UnaryOp op, A x, A param) {
  constexpr A kSqrt1_2 = static_cast<A>(0.70710678118654752440);
  constexpr A kSqrt2OverPi = static_cast<A>(0.79788456080286535588);
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Abs: return fabs(x);
    case UnaryOp::Exp: return exp(x);
    case UnaryOp::Log: return log(x);
    case UnaryOp::Sqrt: return sqrt(x);
    case UnaryOp::Rsqrt: return A(1) / sqrt(x);
    case UnaryOp::Square: return x * x;
    case UnaryOp::Reciprocal: return A(1) / x;
    case UnaryOp::Sin: return sin(x);
    case UnaryOp::Cos: return cos(x);
    case UnaryOp::Relu: return x <= A(0) ? A(0) : x;  // NaN stays NaN (see ops/cpu/elementwise_math.h)
    case UnaryOp::Gelu: return A(0.5) * x * (A(1) + erf(x * kSqrt1_2));
    case UnaryOp::GeluTanh: return A(0.5) * x * (A(1) + tanh(kSqrt2OverPi * (x + A(0.044715) * x * x * x)));
    case UnaryOp::Silu: return x / (A(1) + exp(-x));
    case UnaryOp::Sigmoid: return A(1) / (A(1) + exp(-x));
    case UnaryOp::Tanh: return tanh(x);
    case UnaryOp::PowScalar: return pow(x, param);
    case UnaryOp::LeakyRelu: return x > A(0) ? x : x * param;
  }
  return x;
}

template <class A>
__device__ __forceinline__ A unary_derivative(UnaryOp op, A x, A y, A param) {
  constexpr A kSqrt1_2 = static_cast<A>(0.70710678118654752440);
  constexpr A kInvSqrt2Pi = static_cast<A>(0.39894228040143267794);
  constexpr A kSqrt2OverPi = static_cast<A>(0.79788456080286535588);
  switch (op) {
    case UnaryOp::Neg: return A(-1);
    case UnaryOp::Abs: return x > A(0) ? A(1) : (x < A(0) ? A(-1) : A(0));
    case UnaryOp::Exp: return y;
    case UnaryOp::Log: return A(1) / x;
    case UnaryOp::Sqrt: return A(0.5) / y;
    case UnaryOp::Rsqrt: return A(-0.5) * y * y * y;
    case UnaryOp::Square: return A(2) * x;
    case UnaryOp::Reciprocal: return -y * y;
    case UnaryOp::Sin: return cos(x);
    case UnaryOp::Cos: return -sin(x);
    case UnaryOp::Relu: return x <= A(0) ? A(0) : A(1);
    case UnaryOp::Gelu: {
      A cdf = A(0.5) * (A(1) + erf(x * kSqrt1_2));
      return cdf + x * kInvSqrt2Pi * exp(A(-0.5) * x * x);
    }
    case UnaryOp::GeluTanh: {
      A inner = kSqrt2OverPi * (x + A(0.044715) * x * x * x);
      A t = tanh(inner);
      A dinner = kSqrt2OverPi * (A(1) + A(3 * 0.044715) * x * x);
      return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * dinner;
    }
    case UnaryOp::Silu: {
      A s = A(1) / (A(1) + exp(-x));
      return s * (A(1) + x * (A(1) - s));
    }
    case UnaryOp::Sigmoid: return y * (A(1) - y);
    case UnaryOp::Tanh: return A(1) - y * y;
    case UnaryOp::PowScalar: return param * pow(x, param - A(1));
    case UnaryOp::LeakyRelu: return x > A(0) ? A(1) : param;
  }
  return A(0);
}

template <class A>
__device__ __forceinline__ A binary_value(BinaryOp op, A a, A b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    case BinaryOp::Pow: return pow(a, b);
    case BinaryOp::Maximum: return a > b || a != a ? a : b;
    case BinaryOp::Minimum: return a < b || a != a ? a : b;
    case BinaryOp::Eq: return a == b;
    case BinaryOp::Ne: return a != b;
    case BinaryOp::Lt: return a < b;
    case BinaryOp::Le: return a <= b;
    case BinaryOp::Gt: return a > b;
    case BinaryOp::Ge: return a >= b;
  }
  return a;
}

// ---- functors: x[] are the inputs in the accumulation type -------------------------------------

template <class A>
struct UnaryF {
  UnaryOp op;
  A param;
  __device__ __forceinline__ A operator()(const A* x) const { return unary_value<A>(op, x[0], param); }
};
template <class A>
struct UnaryBackwardF {  // inputs: grad_out, in, out
  UnaryOp op;
  A param;
  __device__ __forceinline__ A operator()(const A* x) const {
    // ReLU selects (0 where x <= 0 even for a NaN gradient, as PyTorch); the rest multiply.
    if (op == UnaryOp::Relu) return x[1] <= A(0) ? A(0) : x[0];
    return x[0] * unary_derivative<A>(op, x[1], x[2], param);
  }
};
template <class A>
struct BinaryF {
  BinaryOp op;
  __device__ __forceinline__ A operator()(const A* x) const { return binary_value<A>(op, x[0], x[1]); }
};
template <class A>
struct BinaryScalarF {
  BinaryOp op;
  A s;
  __device__ __forceinline__ A operator()(const A* x) const { return binary_value<A>(op, x[0], s); }
};
template <class A>
struct ClampF {
  A lo, hi;
  __device__ __forceinline__ A operator()(const A* x) const {
    A v = x[0];
    return v < lo ? lo : (v > hi ? hi : v);
  }
};

template <class T, int N>
struct Inputs {
  const T* p[N];
};

// ---- kernels ------------------------------------------------------------------------------------

// Contiguous: VEC elements per step with 16-byte loads when `vec` (every pointer aligned).
template <int VEC, int N, class T, class O, class A, class F>
__global__ void __launch_bounds__(256)
    ew_contig_kernel(std::int64_t n, bool vec, Inputs<T, N> in, O* __restrict__ out, F f) {
  const std::int64_t stride = std::int64_t{blockDim.x} * gridDim.x;
  std::int64_t start = 0;
  if (vec) {
    const std::int64_t nv = n / VEC;
    for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < nv; i += stride) {
      Vec<T, VEC> v[N];
#pragma unroll
      for (int t = 0; t < N; ++t) v[t] = reinterpret_cast<const Vec<T, VEC>*>(in.p[t])[i];
      Vec<O, VEC> r;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        A x[N];
#pragma unroll
        for (int t = 0; t < N; ++t) x[t] = load_as<A>(v[t].v[j]);
        r.v[j] = store_as<O>(f(x));
      }
      reinterpret_cast<Vec<O, VEC>*>(out)[i] = r;
    }
    start = nv * VEC;
  }
  for (std::int64_t i = start + blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    A x[N];
#pragma unroll
    for (int t = 0; t < N; ++t) x[t] = load_as<A>(in.p[t][i]);
    out[i] = store_as<O>(f(x));
  }
}

// Strided / broadcast: tensor 0 of the indexer is the output, 1..N the inputs.
template <int N, class T, class O, class A, class F>
__global__ void __launch_bounds__(256)
    ew_strided_kernel(std::int64_t n, Indexer<N + 1> ix, Inputs<T, N> in, O* out, F f) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    std::int64_t off[N + 1];
    ix.offsets(i, off);
    A x[N];
#pragma unroll
    for (int t = 0; t < N; ++t) x[t] = load_as<A>(in.p[t][off[t + 1]]);
    out[off[0]] = store_as<O>(f(x));
  }
}

// Row broadcast: a contiguous [rows, cols] output whose inputs are each contiguous of the output's
// shape, one row repeated (strides 0, ..., 0, 1: a bias), or one element repeated (every stride 0:
// a 0-d device scalar such as gradient clipping's coefficient or a loss's incoming gradient). Bit
// `t` of `row_inputs` marks input t as the row, of `scalar_inputs` as the element. VEC columns per
// step (cols % VEC == 0, every non-scalar pointer 16-byte aligned): one division per vector, where
// the strided kernel's indexer pays several per element (a Linear's bias add on an H200 ran at
// 0.6 TB/s through it, and a gradient times a 0-d scalar at about 1 TB/s).
template <int VEC, int N, class T, class O, class A, class F>
__global__ void __launch_bounds__(256)
    ew_row_broadcast_kernel(std::int64_t rows, std::int64_t cols, unsigned row_inputs, unsigned scalar_inputs,
                            Inputs<T, N> in, O* __restrict__ out, F f) {
  const std::int64_t per_row = cols / VEC, n = rows * per_row;
  A s[N];
#pragma unroll
  for (int t = 0; t < N; ++t) s[t] = (scalar_inputs >> t) & 1u ? load_as<A>(in.p[t][0]) : A(0);
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    const std::int64_t col_vec = i % per_row;
    Vec<T, VEC> v[N];
#pragma unroll
    for (int t = 0; t < N; ++t)
      if (!((scalar_inputs >> t) & 1u))
        v[t] = reinterpret_cast<const Vec<T, VEC>*>(in.p[t])[(row_inputs >> t) & 1u ? col_vec : i];
    Vec<O, VEC> r;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      A x[N];
#pragma unroll
      for (int t = 0; t < N; ++t) x[t] = (scalar_inputs >> t) & 1u ? s[t] : load_as<A>(v[t].v[j]);
      r.v[j] = store_as<O>(f(x));
    }
    reinterpret_cast<Vec<O, VEC>*>(out)[i] = r;
  }
}

// Which inputs are a broadcast row (bit t of `rows`) or a broadcast element (bit t of `scalars`)
// of a contiguous output, the others being contiguous of its shape; nullopt when the call is not
// that shape (then the general kernels run).
struct BroadcastInputs {
  unsigned rows = 0, scalars = 0;
};
template <int N>
std::optional<BroadcastInputs> broadcast_inputs(const Tensor& out, const std::array<const Tensor*, N>& ins) {
  if (out.dim() < 1 || !out.is_contiguous()) return std::nullopt;
  BroadcastInputs b;
  for (int t = 0; t < N; ++t) {
    const Tensor& x = *ins[t];
    if (x.shape() != out.shape()) return std::nullopt;
    if (x.is_contiguous()) continue;
    const Strides& st = x.strides();
    bool leading_zero = true;
    for (std::size_t d = 0; d + 1 < st.size(); ++d) leading_zero = leading_zero && st[d] == 0;
    if (!leading_zero) return std::nullopt;
    if (st.back() == 0) {
      b.scalars |= 1u << t;
    } else if (st.back() == 1 && out.dim() >= 2) {
      b.rows |= 1u << t;
    } else {
      return std::nullopt;
    }
  }
  if (b.rows == 0 && b.scalars == 0) return std::nullopt;
  return b;
}

template <int N, class T, class O, class A, class F>
void launch_ew(const Tensor& out, const std::array<const Tensor*, N>& ins, F f) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  Launch l(out);
  std::array<const Strides*, N + 1> strides;
  strides[0] = &out.strides();
  Inputs<T, N> in;
  for (int t = 0; t < N; ++t) {
    strides[t + 1] = &ins[t]->strides();
    in.p[t] = static_cast<const T*>(ins[t]->data_ptr());
  }
  auto ix = make_indexer<N + 1>(out.shape(), strides);
  O* o = static_cast<O*>(out.data_ptr());
  if (is_flat(ix)) {
    constexpr int VEC = 16 / sizeof(T) >= 1 ? 16 / sizeof(T) : 1;
    bool vec = (reinterpret_cast<std::uintptr_t>(o) % (sizeof(O) * VEC)) == 0;
    for (int t = 0; t < N; ++t) vec = vec && aligned16(in.p[t]);
    ew_contig_kernel<VEC, N, T, O, A, F>
        <<<grid_for((vec ? n / VEC : n) + 1, 256, l.index), 256, 0, l.stream>>>(n, vec, in, o, f);
  } else if (const std::optional<BroadcastInputs> b = broadcast_inputs<N>(out, ins)) {
    constexpr int VEC = 16 / sizeof(T) >= 1 ? 16 / sizeof(T) : 1;
    // Without a row input the output is one long row (a scalar's broadcast has no row structure).
    const std::int64_t cols = b->rows != 0 ? out.shape().back() : n;
    bool vec = cols % VEC == 0 && (reinterpret_cast<std::uintptr_t>(o) % (sizeof(O) * VEC)) == 0;
    for (int t = 0; t < N; ++t) vec = vec && ((b->scalars >> t) & 1u || aligned16(in.p[t]));
    if (vec)
      ew_row_broadcast_kernel<VEC, N, T, O, A, F>
          <<<grid_for(n / VEC, 256, l.index), 256, 0, l.stream>>>(n / cols, cols, b->rows, b->scalars, in, o, f);
    else
      ew_strided_kernel<N, T, O, A, F><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(n, ix, in, o, f);
  } else {
    ew_strided_kernel<N, T, O, A, F><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(n, ix, in, o, f);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

template <class U>
__global__ void __launch_bounds__(256)
    where_kernel(std::int64_t n, Indexer<4> ix, const bool* c, const U* a, const U* b, U* out) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    std::int64_t off[4];
    ix.offsets(i, off);
    out[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
  }
}

template <class U>
void launch_where(const Launch& l, std::int64_t n, const Indexer<4>& ix, const Tensor& c, const Tensor& a,
                  const Tensor& b, const Tensor& out) {
  where_kernel<U><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(
      n, ix, static_cast<const bool*>(c.data_ptr()), static_cast<const U*>(a.data_ptr()),
      static_cast<const U*>(b.data_ptr()), static_cast<U*>(out.data_ptr()));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void unary(UnaryOp op, const Tensor& in, const Tensor& out, double param) {
  KILN_DISPATCH_NUMERIC(out.dtype(), "unary", [&]<class T>() {
    using A = acc_t<T>;
    launch_ew<1, T, T, A>(out, {&in}, UnaryF<A>{op, static_cast<A>(param)});
  });
}

void unary_backward(UnaryOp op, const Tensor& grad_out, const Tensor& in, const Tensor& out, const Tensor& grad_in,
                    double param) {
  KILN_DISPATCH_FLOATING(grad_in.dtype(), "unary_backward", [&]<class T>() {
    using A = acc_t<T>;
    launch_ew<3, T, T, A>(grad_in, {&grad_out, &in, &out}, UnaryBackwardF<A>{op, static_cast<A>(param)});
  });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  KILN_DISPATCH_NUMERIC(a.dtype(), "binary", [&]<class T>() {
    using A = acc_t<T>;
    if (out.dtype() == DType::Bool)
      launch_ew<2, T, bool, A>(out, {&a, &b}, BinaryF<A>{op});
    else
      launch_ew<2, T, T, A>(out, {&a, &b}, BinaryF<A>{op});
  });
}

void binary_scalar(BinaryOp op, const Tensor& a, double scalar, const Tensor& out) {
  KILN_DISPATCH_NUMERIC(a.dtype(), "binary_scalar", [&]<class T>() {
    using A = acc_t<T>;
    if (out.dtype() == DType::Bool)
      launch_ew<1, T, bool, A>(out, {&a}, BinaryScalarF<A>{op, static_cast<A>(scalar)});
    else
      launch_ew<1, T, T, A>(out, {&a}, BinaryScalarF<A>{op, static_cast<A>(scalar)});
  });
}

void clamp(const Tensor& in, double lo, double hi, const Tensor& out) {
  KILN_DISPATCH_NUMERIC(out.dtype(), "clamp", [&]<class T>() {
    using A = acc_t<T>;
    launch_ew<1, T, T, A>(out, {&in}, ClampF<A>{static_cast<A>(lo), static_cast<A>(hi)});
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  Launch l(out);
  auto ix = make_indexer<4>(out.shape(), {&out.strides(), &cond.strides(), &a.strides(), &b.strides()});
  switch (dtype_size(out.dtype())) {
    case 1: return launch_where<std::uint8_t>(l, n, ix, cond, a, b, out);
    case 2: return launch_where<std::uint16_t>(l, n, ix, cond, a, b, out);
    case 4: return launch_where<std::uint32_t>(l, n, ix, cond, a, b, out);
    default: return launch_where<std::uint64_t>(l, n, ix, cond, a, b, out);
  }
}

}  // namespace kiln::ops::cuda
