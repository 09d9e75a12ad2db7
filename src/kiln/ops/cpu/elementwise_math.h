#pragma once
// The scalar math of every unary and binary op, shared by the CPU kernels (and readable as the
// reference for the CUDA ones). Computed in `Acc` (double for f64, float otherwise).
#include <cmath>

#include "kiln/ops/op_kinds.h"

namespace kiln::ops {

template <class Acc>
inline Acc unary_value(UnaryOp op, Acc x, Acc param) {
  constexpr Acc kSqrt1_2 = static_cast<Acc>(0.70710678118654752440);
  constexpr Acc kSqrt2OverPi = static_cast<Acc>(0.79788456080286535588);
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Abs: return std::abs(x);
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return std::log(x);
    case UnaryOp::Sqrt: return std::sqrt(x);
    case UnaryOp::Rsqrt: return Acc(1) / std::sqrt(x);
    case UnaryOp::Square: return x * x;
    case UnaryOp::Reciprocal: return Acc(1) / x;
    case UnaryOp::Sin: return std::sin(x);
    case UnaryOp::Cos: return std::cos(x);
    // `x <= 0 ? 0 : x`, not `x > 0 ? x : 0`: a NaN fails both tests and must come out NaN (PyTorch's
    // threshold rule), or a diverged run reports finite losses.
    case UnaryOp::Relu: return x <= Acc(0) ? Acc(0) : x;
    case UnaryOp::Gelu: return Acc(0.5) * x * (Acc(1) + std::erf(x * kSqrt1_2));
    case UnaryOp::GeluTanh: return Acc(0.5) * x * (Acc(1) + std::tanh(kSqrt2OverPi * (x + Acc(0.044715) * x * x * x)));
    case UnaryOp::Silu: return x / (Acc(1) + std::exp(-x));
    case UnaryOp::Sigmoid: return Acc(1) / (Acc(1) + std::exp(-x));
    case UnaryOp::Tanh: return std::tanh(x);
    case UnaryOp::PowScalar: return std::pow(x, param);
    case UnaryOp::LeakyRelu: return x > Acc(0) ? x : x * param;
  }
  return x;
}

// d op(x) / dx, given x and y = op(x).
template <class Acc>
inline Acc unary_derivative(UnaryOp op, Acc x, Acc y, Acc param) {
  constexpr Acc kSqrt1_2 = static_cast<Acc>(0.70710678118654752440);
  constexpr Acc kInvSqrt2Pi = static_cast<Acc>(0.39894228040143267794);
  constexpr Acc kSqrt2OverPi = static_cast<Acc>(0.79788456080286535588);
  switch (op) {
    case UnaryOp::Neg: return Acc(-1);
    case UnaryOp::Abs: return x > Acc(0) ? Acc(1) : (x < Acc(0) ? Acc(-1) : Acc(0));
    case UnaryOp::Exp: return y;
    case UnaryOp::Log: return Acc(1) / x;
    case UnaryOp::Sqrt: return Acc(0.5) / y;
    case UnaryOp::Rsqrt: return Acc(-0.5) * y * y * y;
    case UnaryOp::Square: return Acc(2) * x;
    case UnaryOp::Reciprocal: return -y * y;
    case UnaryOp::Sin: return std::cos(x);
    case UnaryOp::Cos: return -std::sin(x);
    case UnaryOp::Relu: return x <= Acc(0) ? Acc(0) : Acc(1);  // NaN input: the gradient passes (see unary_grad)
    case UnaryOp::Gelu: {
      Acc cdf = Acc(0.5) * (Acc(1) + std::erf(x * kSqrt1_2));
      return cdf + x * kInvSqrt2Pi * std::exp(Acc(-0.5) * x * x);
    }
    case UnaryOp::GeluTanh: {
      Acc inner = kSqrt2OverPi * (x + Acc(0.044715) * x * x * x);
      Acc t = std::tanh(inner);
      Acc dinner = kSqrt2OverPi * (Acc(1) + Acc(3 * 0.044715) * x * x);
      return Acc(0.5) * (Acc(1) + t) + Acc(0.5) * x * (Acc(1) - t * t) * dinner;
    }
    case UnaryOp::Silu: {
      Acc s = Acc(1) / (Acc(1) + std::exp(-x));
      return s * (Acc(1) + x * (Acc(1) - s));
    }
    case UnaryOp::Sigmoid: return y * (Acc(1) - y);
    case UnaryOp::Tanh: return Acc(1) - y * y;
    case UnaryOp::PowScalar: return param * std::pow(x, param - Acc(1));
    case UnaryOp::LeakyRelu: return x > Acc(0) ? Acc(1) : param;
  }
  return Acc(0);
}

// grad_in for grad_out `g`: g * d op(x)/dx, except ReLU, which selects rather than multiplies (as
// PyTorch's threshold_backward): 0 where x <= 0 even for a NaN g, g where x > 0 or x is NaN.
template <class Acc>
inline Acc unary_grad(UnaryOp op, Acc g, Acc x, Acc y, Acc param) {
  if (op == UnaryOp::Relu) return x <= Acc(0) ? Acc(0) : g;
  return g * unary_derivative<Acc>(op, x, y, param);
}

template <class Acc>
inline Acc binary_value(BinaryOp op, Acc a, Acc b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    case BinaryOp::Pow: return std::pow(a, b);
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

inline bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq; }

}  // namespace kiln::ops
