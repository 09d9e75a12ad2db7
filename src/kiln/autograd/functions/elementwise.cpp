// Differentiable elementwise ops. Broadcasting's backward sums the gradient back to each
// input's shape (ops::sum_to_shape).
#include "kiln/ops/elementwise.h"

#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"

namespace kiln {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;
using ops::BinaryOp;
using ops::UnaryOp;

namespace {

Tensor unary_op(UnaryOp op, const char* node, const Tensor& x, double param = 0) {
  Tensor y = ops::unary(op, x, param);
  if (needs_grad({x})) {
    // Ops whose derivative is cheapest from the output save y too.
    bool uses_out = op == UnaryOp::Exp || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt || op == UnaryOp::Reciprocal ||
                    op == UnaryOp::Sigmoid || op == UnaryOp::Tanh;
    SavedTensor sy = uses_out ? SavedTensor(y.detach()) : SavedTensor();
    record(node, {x}, {&y}, [op, param, sx = SavedTensor(x.detach()), sy, node](const Grads& g) -> Grads {
      if (!g[0].defined()) return {Tensor()};
      const Tensor& xv = sx.get(node);
      return {ops::unary_backward(op, g[0], xv, sy.defined() ? sy.get(node) : Tensor(), param)};
    });
  }
  return y;
}

Tensor reduce_grad(const Tensor& g, const Tensor& like) { return ops::sum_to_shape(g, like.shape()); }

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = ops::binary(BinaryOp::Add, a, b);
  if (needs_grad({a, b})) {
    if (a.shape() == b.shape()) {
      // No broadcasting: both gradients are g itself (sum_to_shape would return it unchanged). A
      // closure that captures nothing stays inside std::function: no heap block, no shape copies.
      record("AddBackward", {a, b}, {&y}, [](const Grads& g) -> Grads { return {g[0], g[0]}; });
      return y;
    }
    record("AddBackward", {a, b}, {&y}, [sa = a.shape(), sb = b.shape()](const Grads& g) -> Grads {
      return {ops::sum_to_shape(g[0], sa), ops::sum_to_shape(g[0], sb)};
    });
  }
  return y;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor y = ops::binary(BinaryOp::Sub, a, b);
  if (needs_grad({a, b})) {
    if (a.shape() == b.shape()) {  // no broadcasting: as in add
      record("SubBackward", {a, b}, {&y}, [](const Grads& g) -> Grads {
        return {g[0], ops::unary(UnaryOp::Neg, g[0])};
      });
      return y;
    }
    record("SubBackward", {a, b}, {&y}, [sa = a.shape(), sb = b.shape()](const Grads& g) -> Grads {
      return {ops::sum_to_shape(g[0], sa), ops::sum_to_shape(ops::unary(UnaryOp::Neg, g[0]), sb)};
    });
  }
  return y;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor y = ops::binary(BinaryOp::Mul, a, b);
  if (needs_grad({a, b})) {
    bool ga = a.requires_grad(), gb = b.requires_grad();
    record("MulBackward", {a, b}, {&y},
           [sa = SavedTensor(gb ? a.detach() : Tensor()), sb = SavedTensor(ga ? b.detach() : Tensor()), ga, gb,
            shape_a = a.shape(), shape_b = b.shape()](const Grads& g) -> Grads {
             Grads out(2);
             if (ga) out[0] = ops::sum_to_shape(ops::binary(BinaryOp::Mul, g[0], sb.get("mul")), shape_a);
             if (gb) out[1] = ops::sum_to_shape(ops::binary(BinaryOp::Mul, g[0], sa.get("mul")), shape_b);
             return out;
           });
  }
  return y;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor y = ops::binary(BinaryOp::Div, a, b);
  if (needs_grad({a, b})) {
    record("DivBackward", {a, b}, {&y},
           [sa = SavedTensor(a.detach()), sb = SavedTensor(b.detach()), ga = a.requires_grad(),
            gb = b.requires_grad()](const Grads& g) -> Grads {
             Grads out(2);
             const Tensor& bv = sb.get("div");
             if (ga) out[0] = reduce_grad(ops::binary(BinaryOp::Div, g[0], bv), sa.get("div"));
             if (gb) {
               // d(a/b)/db = -a / b^2
               Tensor t = ops::binary(BinaryOp::Div, ops::binary(BinaryOp::Mul, g[0], sa.get("div")),
                                      ops::unary(UnaryOp::Square, bv));
               out[1] = reduce_grad(ops::unary(UnaryOp::Neg, t), bv);
             }
             return out;
           });
  }
  return y;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor y = ops::binary(BinaryOp::Pow, a, b);
  if (needs_grad({a, b})) {
    record("PowBackward", {a, b}, {&y},
           [sa = SavedTensor(a.detach()), sb = SavedTensor(b.detach()), sy = SavedTensor(y.detach()),
            ga = a.requires_grad(), gb = b.requires_grad()](const Grads& g) -> Grads {
             Grads out(2);
             const Tensor& av = sa.get("pow");
             const Tensor& bv = sb.get("pow");
             if (ga) {  // b * a^(b-1)
               Tensor d =
                   ops::binary(BinaryOp::Mul, bv, ops::binary(BinaryOp::Pow, av, ops::binary(BinaryOp::Sub, bv, 1.0)));
               out[0] = reduce_grad(ops::binary(BinaryOp::Mul, g[0], d), av);
             }
             if (gb) {  // a^b * log(a)
               Tensor d = ops::binary(BinaryOp::Mul, sy.get("pow"), ops::unary(UnaryOp::Log, av));
               out[1] = reduce_grad(ops::binary(BinaryOp::Mul, g[0], d), bv);
             }
             return out;
           });
  }
  return y;
}

namespace {
// maximum/minimum: the gradient goes to the chosen operand (split evenly on ties, as PyTorch).
Tensor extremum(BinaryOp op, const char* node, const Tensor& a, const Tensor& b) {
  Tensor y = ops::binary(op, a, b);
  if (needs_grad({a, b})) {
    record(node, {a, b}, {&y},
           [sa = SavedTensor(a.detach()), sb = SavedTensor(b.detach()), op](const Grads& g) -> Grads {
             const Tensor& av = sa.get("maximum");
             const Tensor& bv = sb.get("maximum");
             BinaryOp wins = op == BinaryOp::Maximum ? BinaryOp::Gt : BinaryOp::Lt;
             Tensor a_wins = ops::binary(wins, av, bv).to(g[0].dtype());
             Tensor tie = ops::binary(BinaryOp::Eq, av, bv).to(g[0].dtype());
             Tensor wa = ops::binary(BinaryOp::Add, a_wins, ops::binary(BinaryOp::Mul, tie, 0.5));
             Tensor wb = ops::binary(BinaryOp::Sub, ops::binary(BinaryOp::Mul, wa, -1.0), -1.0);  // 1 - wa
             return {reduce_grad(ops::binary(BinaryOp::Mul, g[0], wa), av),
                     reduce_grad(ops::binary(BinaryOp::Mul, g[0], wb), bv)};
           });
  }
  return y;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::Maximum, "MaximumBackward", a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::Minimum, "MinimumBackward", a, b); }

namespace {
Tensor scalar_op(BinaryOp op, const char* node, const Tensor& a, double s) {
  Tensor y = ops::binary(op, a, s);
  if (needs_grad({a})) {
    record(node, {a}, {&y}, [op, s](const Grads& g) -> Grads {
      if (op == BinaryOp::Mul) return {ops::binary(BinaryOp::Mul, g[0], s)};
      if (op == BinaryOp::Div) return {ops::binary(BinaryOp::Div, g[0], s)};
      return {g[0]};  // add, sub
    });
  }
  return y;
}
}  // namespace

Tensor add(const Tensor& a, double s) { return scalar_op(BinaryOp::Add, "AddScalarBackward", a, s); }
Tensor sub(const Tensor& a, double s) { return scalar_op(BinaryOp::Sub, "SubScalarBackward", a, s); }
Tensor mul(const Tensor& a, double s) { return scalar_op(BinaryOp::Mul, "MulScalarBackward", a, s); }
Tensor div(const Tensor& a, double s) { return scalar_op(BinaryOp::Div, "DivScalarBackward", a, s); }
Tensor rsub(double s, const Tensor& a) { return add(neg(a), s); }
Tensor rdiv(double s, const Tensor& a) { return mul(unary_op(UnaryOp::Reciprocal, "ReciprocalBackward", a), s); }
Tensor pow(const Tensor& a, double e) { return unary_op(UnaryOp::PowScalar, "PowScalarBackward", a, e); }

Tensor neg(const Tensor& x) { return unary_op(UnaryOp::Neg, "NegBackward", x); }
Tensor abs(const Tensor& x) { return unary_op(UnaryOp::Abs, "AbsBackward", x); }
Tensor exp(const Tensor& x) { return unary_op(UnaryOp::Exp, "ExpBackward", x); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::Log, "LogBackward", x); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::Sqrt, "SqrtBackward", x); }
Tensor rsqrt(const Tensor& x) { return unary_op(UnaryOp::Rsqrt, "RsqrtBackward", x); }
Tensor square(const Tensor& x) { return unary_op(UnaryOp::Square, "SquareBackward", x); }
Tensor sin(const Tensor& x) { return unary_op(UnaryOp::Sin, "SinBackward", x); }
Tensor cos(const Tensor& x) { return unary_op(UnaryOp::Cos, "CosBackward", x); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::Relu, "ReluBackward", x); }
Tensor leaky_relu(const Tensor& x, double slope) { return unary_op(UnaryOp::LeakyRelu, "LeakyReluBackward", x, slope); }
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  return tanh_approximation ? unary_op(UnaryOp::GeluTanh, "GeluBackward", x)
                            : unary_op(UnaryOp::Gelu, "GeluBackward", x);
}
Tensor silu(const Tensor& x) { return unary_op(UnaryOp::Silu, "SiluBackward", x); }
Tensor sigmoid(const Tensor& x) { return unary_op(UnaryOp::Sigmoid, "SigmoidBackward", x); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::Tanh, "TanhBackward", x); }

Tensor clamp(const Tensor& x, double lo, double hi) {
  Tensor y = ops::clamp(x, lo, hi);
  if (needs_grad({x})) {
    record("ClampBackward", {x}, {&y}, [sx = SavedTensor(x.detach()), lo, hi](const Grads& g) -> Grads {
      const Tensor& xv = sx.get("clamp");
      Tensor inside = ops::binary(BinaryOp::Mul, ops::binary(BinaryOp::Ge, xv, lo).to(g[0].dtype()),
                                  ops::binary(BinaryOp::Le, xv, hi).to(g[0].dtype()));
      return {ops::binary(BinaryOp::Mul, g[0], inside)};
    });
  }
  return y;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor y = ops::where(cond, a, b);
  if (needs_grad({a, b})) {
    record("WhereBackward", {a, b}, {&y}, [c = cond.detach(), sa = a.shape(), sb = b.shape()](const Grads& g) -> Grads {
      Tensor zero = Tensor::zeros({}, g[0].dtype(), g[0].device());
      return {ops::sum_to_shape(ops::where(c, g[0], zero), sa), ops::sum_to_shape(ops::where(c, zero, g[0]), sb)};
    });
  }
  return y;
}

Tensor eq(const Tensor& a, const Tensor& b) { return ops::binary(BinaryOp::Eq, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return ops::binary(BinaryOp::Lt, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return ops::binary(BinaryOp::Gt, a, b); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double s) { return add(a, s); }
Tensor operator-(const Tensor& a, double s) { return sub(a, s); }
Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
Tensor operator/(const Tensor& a, double s) { return div(a, s); }
Tensor operator+(double s, const Tensor& a) { return add(a, s); }
Tensor operator-(double s, const Tensor& a) { return rsub(s, a); }
Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
Tensor operator/(double s, const Tensor& a) { return rdiv(s, a); }
Tensor operator-(const Tensor& x) { return neg(x); }

}  // namespace kiln
