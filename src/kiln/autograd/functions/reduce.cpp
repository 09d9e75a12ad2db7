// Differentiable reductions.
#include "kiln/ops/reduce.h"

#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"

namespace kiln {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;
using ops::BinaryOp;
using ops::ReduceOp;

namespace {

// The gradient of a reduction, reshaped to keepdim form so it broadcasts over the input.
Tensor keepdim_view(const Tensor& g, const Shape& in_shape, const std::vector<int>& dims) {
  return ops::contiguous_view(g, ops::reduced_shape(in_shape, dims, true));
}

Tensor expand_grad(const Tensor& g, const Shape& in_shape, const std::vector<int>& dims) {
  Tensor out = Tensor::empty(in_shape, g.dtype(), g.device());
  ops::copy_into(out, keepdim_view(g, in_shape, dims));
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, std::vector<std::int64_t> dims, bool keepdim) {
  auto nd = ops::normalize_dims(dims, x.dim(), "sum");
  Tensor y = ops::reduce(ReduceOp::Sum, x, dims, keepdim);
  if (needs_grad({x})) {
    record("SumBackward", {x}, {&y},
           [shape = x.shape(), nd](const Grads& g) -> Grads { return {expand_grad(g[0], shape, nd)}; });
  }
  return y;
}

Tensor mean(const Tensor& x, std::vector<std::int64_t> dims, bool keepdim) {
  auto nd = ops::normalize_dims(dims, x.dim(), "mean");
  Tensor y = ops::reduce(ReduceOp::Mean, x, dims, keepdim);
  if (needs_grad({x})) {
    std::int64_t count = 1;
    for (int d : nd) count *= x.shape()[d];
    record("MeanBackward", {x}, {&y}, [shape = x.shape(), nd, count](const Grads& g) -> Grads {
      return {expand_grad(ops::binary(BinaryOp::Div, g[0], static_cast<double>(count)), shape, nd)};
    });
  }
  return y;
}

namespace {
// amax/amin: the gradient is shared evenly among the elements equal to the extremum.
Tensor extremum(ReduceOp op, const char* node, const Tensor& x, std::vector<std::int64_t> dims, bool keepdim) {
  auto nd = ops::normalize_dims(dims, x.dim(), node);
  Tensor y = ops::reduce(op, x, dims, keepdim);
  if (needs_grad({x})) {
    record(node, {x}, {&y},
           [sx = SavedTensor(x.detach()), sy = SavedTensor(y.detach()), nd, node](const Grads& g) -> Grads {
             const Tensor& xv = sx.get(node);
             Tensor hit = ops::binary(BinaryOp::Eq, xv, keepdim_view(sy.get(node), xv.shape(), nd)).to(xv.dtype());
             Tensor count = ops::reduce(ReduceOp::Sum, hit, std::vector<std::int64_t>(nd.begin(), nd.end()), true);
             Tensor share = ops::binary(BinaryOp::Div, keepdim_view(g[0], xv.shape(), nd), count);
             return {ops::binary(BinaryOp::Mul, hit, share)};
           });
  }
  return y;
}
}  // namespace

Tensor amax(const Tensor& x, std::vector<std::int64_t> dims, bool keepdim) {
  return extremum(ReduceOp::Max, "AmaxBackward", x, std::move(dims), keepdim);
}
Tensor amin(const Tensor& x, std::vector<std::int64_t> dims, bool keepdim) {
  return extremum(ReduceOp::Min, "AminBackward", x, std::move(dims), keepdim);
}

Tensor var(const Tensor& x, std::vector<std::int64_t> dims, int correction, bool keepdim) {
  auto nd = ops::normalize_dims(dims, x.dim(), "var");
  Tensor y = ops::variance(x, dims, correction, keepdim);
  if (needs_grad({x})) {
    std::int64_t count = 1;
    for (int d : nd) count *= x.shape()[d];
    record("VarBackward", {x}, {&y}, [sx = SavedTensor(x.detach()), nd, count, correction](const Grads& g) -> Grads {
      // d var / dx = 2 (x - mean) / (n - correction)
      const Tensor& xv = sx.get("var");
      Tensor m = ops::reduce(ReduceOp::Mean, xv, std::vector<std::int64_t>(nd.begin(), nd.end()), true);
      Tensor centered = ops::binary(BinaryOp::Sub, xv, m);
      Tensor scale =
          ops::binary(BinaryOp::Mul, keepdim_view(g[0], xv.shape(), nd), 2.0 / static_cast<double>(count - correction));
      return {ops::binary(BinaryOp::Mul, centered, scale)};
    });
  }
  return y;
}

Tensor argmax(const Tensor& x, std::int64_t dim, bool keepdim) { return ops::argmax(x, dim, keepdim); }
Tensor argmin(const Tensor& x, std::int64_t dim, bool keepdim) { return ops::argmin(x, dim, keepdim); }

}  // namespace kiln
