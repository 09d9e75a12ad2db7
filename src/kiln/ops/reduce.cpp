#include "kiln/ops/reduce.h"

#include <algorithm>

#include "kiln/ops/checks.h"
#include "kiln/ops/kernels.h"

namespace kiln::ops {

std::vector<int> normalize_dims(const std::vector<std::int64_t>& dims, std::int64_t ndim, const char* op) {
  std::vector<int> out;
  if (dims.empty()) {
    for (int d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (auto d : dims) out.push_back(wrap_dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  KILN_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), "{}: a dimension appears twice", op);
  return out;
}

Shape reduced_shape(const Shape& shape, const std::vector<int>& dims, bool keepdim) {
  Shape out;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced)
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

namespace {
const char* reduce_name(ReduceOp op) {
  static constexpr const char* names[] = {"sum", "mean", "max", "min", "prod"};
  return names[static_cast<int>(op)];
}

Tensor drop_dims(const Tensor& kept, const Shape& shape) {
  return make_view(kept, shape, contiguous_strides(shape), kept.storage_offset());
}
}  // namespace

Tensor reduce(ReduceOp op, const Tensor& x, std::vector<std::int64_t> dims, bool keepdim) {
  const char* name = reduce_name(op);
  check_defined(name, x, "input");
  auto d = normalize_dims(dims, x.dim(), name);
  if ((op == ReduceOp::Max || op == ReduceOp::Min) && x.numel() == 0)
    KILN_FAIL("{}: cannot reduce an empty tensor {}", name, x.describe());
  Tensor out = Tensor::empty(reduced_shape(x.shape(), d, true), x.dtype(), x.device());
  KILN_KERNEL(x.device(), reduce)(op, x, d, out);
  return keepdim ? out : drop_dims(out, reduced_shape(x.shape(), d, false));
}

Tensor variance(const Tensor& x, std::vector<std::int64_t> dims, int correction, bool keepdim) {
  check_floating("var", x);
  auto d = normalize_dims(dims, x.dim(), "var");
  Tensor out = Tensor::empty(reduced_shape(x.shape(), d, true), x.dtype(), x.device());
  KILN_KERNEL(x.device(), variance)(x, d, correction, out);
  return keepdim ? out : drop_dims(out, reduced_shape(x.shape(), d, false));
}

namespace {
Tensor arg_reduce(bool is_max, const Tensor& x, std::int64_t dim, bool keepdim) {
  const char* name = is_max ? "argmax" : "argmin";
  int d = wrap_dim(dim, x.dim(), name);
  KILN_CHECK(x.numel() > 0, "{}: cannot reduce an empty tensor {}", name, x.describe());
  std::vector<int> dv{d};
  Tensor out = Tensor::empty(reduced_shape(x.shape(), dv, true), DType::I64, x.device());
  KILN_KERNEL(x.device(), arg_reduce)(is_max, x, d, out);
  return keepdim ? out : drop_dims(out, reduced_shape(x.shape(), dv, false));
}
}  // namespace

Tensor argmax(const Tensor& x, std::int64_t dim, bool keepdim) { return arg_reduce(true, x, dim, keepdim); }
Tensor argmin(const Tensor& x, std::int64_t dim, bool keepdim) { return arg_reduce(false, x, dim, keepdim); }

}  // namespace kiln::ops
