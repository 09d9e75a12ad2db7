#include "kiln/ops/elementwise.h"

#include <algorithm>

#include "kiln/ops/checks.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/cpu/elementwise_math.h"
#include "kiln/ops/kernels.h"
#include "kiln/ops/memory_format.h"
#include "kiln/ops/reduce.h"

namespace kiln::ops {

const char* unary_name(UnaryOp op) {
  static constexpr const char* names[] = {"neg",       "abs",        "exp",     "log",  "sqrt", "rsqrt",
                                          "square",    "reciprocal", "sin",     "cos",  "relu", "gelu",
                                          "gelu_tanh", "silu",       "sigmoid", "tanh", "pow",  "leaky_relu"};
  return names[static_cast<int>(op)];
}

const char* binary_name(BinaryOp op) {
  static constexpr const char* names[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                          "eq",  "ne",  "lt",  "le",  "gt",  "ge"};
  return names[static_cast<int>(op)];
}

// Elementwise results keep a dense non-contiguous input layout (channels-last activations stay
// channels-last); operands that share such a layout run through the kernels as flat 1-D views,
// which is their contiguous fast path.
namespace {

// out = empty_like_dense(in): runs kernel(in, out) on flat views when out took in's dense
// non-contiguous layout, on the tensors themselves otherwise.
template <class Kernel>
void run_keeping_layout(const Tensor& in, const Tensor& out, Kernel&& kernel) {
  if (!in.is_contiguous() && out.strides() == in.strides())
    kernel(flat_dense_view(in), flat_dense_view(out));
  else
    kernel(in, out);
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x, double param) {
  check_defined(unary_name(op), x, "input");
  Tensor out = empty_like_dense(x, x.dtype());
  if (out.numel())
    run_keeping_layout(x, out, [&](const Tensor& i, const Tensor& o) {
      KILN_KERNEL(x.device(), unary)(op, i, o, param);
    });
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& grad_out, const Tensor& x, const Tensor& y, double param) {
  const Tensor& yy = y.defined() ? y : x;
  if (x.numel() && same_dense_layout(grad_out, x) && yy.strides() == x.strides()) {
    Tensor grad_in = empty_like_dense(x, x.dtype());
    KILN_KERNEL(x.device(), unary_backward)
    (op, flat_dense_view(grad_out), flat_dense_view(x), flat_dense_view(yy), flat_dense_view(grad_in), param);
    return grad_in;
  }
  Tensor grad_in = empty_like(x);
  if (grad_in.numel()) KILN_KERNEL(x.device(), unary_backward)(op, grad_out, x, yy, grad_in, param);
  return grad_in;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_defined(name, a, "first operand");
  check_defined(name, b, "second operand");
  check_compatible(name, a, b);
  const DType out_dtype = is_comparison(op) ? DType::Bool : a.dtype();
  if (a.shape() == b.shape()) {
    // No broadcasting (the common case): skip the shape computation and the two expanded views,
    // which would be `a` and `b` themselves.
    if (same_dense_layout(a, b)) {
      Tensor out = empty_like_dense(a, out_dtype);
      KILN_KERNEL(a.device(), binary)(op, flat_dense_view(a), flat_dense_view(b), flat_dense_view(out));
      return out;
    }
    Tensor out = Tensor::empty(a.shape(), out_dtype, a.device());
    if (out.numel()) KILN_KERNEL(a.device(), binary)(op, a, b, out);
    return out;
  }
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, out_dtype, a.device());
  if (out.numel()) KILN_KERNEL(a.device(), binary)(op, broadcast_to(a, shape, name), broadcast_to(b, shape, name), out);
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, double scalar) {
  check_defined(binary_name(op), a, "first operand");
  Tensor out = empty_like_dense(a, is_comparison(op) ? DType::Bool : a.dtype());
  if (out.numel())
    run_keeping_layout(a, out, [&](const Tensor& i, const Tensor& o) {
      KILN_KERNEL(a.device(), binary_scalar)(op, i, scalar, o);
    });
  return out;
}

void binary_(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_compatible(name, a, b);
  if (same_dense_layout(a, b)) {
    const Tensor fa = flat_dense_view(a);
    KILN_KERNEL(a.device(), binary)(op, fa, flat_dense_view(b), fa);
  } else if (a.numel()) {
    KILN_KERNEL(a.device(), binary)(op, a, broadcast_to(b, a.shape(), name), a);
  }
  a.storage()->bump_version();
}

void binary_(BinaryOp op, const Tensor& a, double scalar) {
  if (a.numel()) KILN_KERNEL(a.device(), binary_scalar)(op, a, scalar, a);
  a.storage()->bump_version();
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_compatible("where", a, b);
  check_same_device("where", cond, a);
  KILN_CHECK(cond.dtype() == DType::Bool, "where: condition must be bool, got {}", cond.describe());
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  if (out.numel()) KILN_KERNEL(a.device(), where)
  (broadcast_to(cond, shape, "where"), broadcast_to(a, shape, "where"), broadcast_to(b, shape, "where"), out);
  return out;
}

Tensor clamp(const Tensor& x, double lo, double hi) {
  KILN_CHECK(lo <= hi, "clamp: min {} is greater than max {}", lo, hi);
  Tensor out = empty_like_dense(x, x.dtype());
  if (out.numel())
    run_keeping_layout(x, out, [&](const Tensor& i, const Tensor& o) { KILN_KERNEL(x.device(), clamp)(i, lo, hi, o); });
  return out;
}

Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  std::vector<std::int64_t> dims;
  std::size_t lead = grad.shape().size() - shape.size();
  for (std::size_t i = 0; i < grad.shape().size(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && grad.shape()[i] != 1)) dims.push_back(static_cast<std::int64_t>(i));
  }
  Tensor summed = reduce(ReduceOp::Sum, grad, dims, /*keepdim=*/true);
  // Drop the leading broadcast dimensions.
  return make_view(summed, shape, contiguous_strides(shape), summed.storage_offset());
}

}  // namespace kiln::ops
