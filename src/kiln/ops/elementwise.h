#pragma once
// Raw elementwise ops with NumPy broadcasting. Differentiable versions: autograd/functions.h.
#include "kiln/ops/op_kinds.h"
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

Tensor unary(UnaryOp op, const Tensor& x, double param = 0);
Tensor unary_backward(UnaryOp op, const Tensor& grad_out, const Tensor& x, const Tensor& y, double param = 0);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor binary(BinaryOp op, const Tensor& a, double scalar);
// In place: a = a op b (b broadcast to a's shape).
void binary_(BinaryOp op, const Tensor& a, const Tensor& b);
void binary_(BinaryOp op, const Tensor& a, double scalar);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor clamp(const Tensor& x, double lo, double hi);
// Sums `grad` (shaped like a broadcast result) back down to `shape`: the backward of broadcasting.
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);

const char* unary_name(UnaryOp op);
const char* binary_name(BinaryOp op);

}  // namespace kiln::ops
