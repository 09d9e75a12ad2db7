#pragma once
// Raw reductions. An empty `dims` reduces over every dimension.
#include <vector>

#include "kiln/ops/op_kinds.h"
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

Tensor reduce(ReduceOp op, const Tensor& x, std::vector<std::int64_t> dims, bool keepdim);
Tensor variance(const Tensor& x, std::vector<std::int64_t> dims, int correction, bool keepdim);
Tensor argmax(const Tensor& x, std::int64_t dim, bool keepdim);
Tensor argmin(const Tensor& x, std::int64_t dim, bool keepdim);
// Sorted, wrapped dims (all dims when empty); shared with the autograd backward of reductions.
std::vector<int> normalize_dims(const std::vector<std::int64_t>& dims, std::int64_t ndim, const char* op);
Shape reduced_shape(const Shape& shape, const std::vector<int>& dims, bool keepdim);

}  // namespace kiln::ops
