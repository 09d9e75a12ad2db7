#pragma once
// Raw view construction (shape/stride arithmetic only, no copy, no autograd). The Tensor methods
// of the same names (autograd/functions/views.cpp) add the backward.
#include <optional>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::views {

// Strides for viewing `t` as `shape` without a copy, or nullopt when its layout forbids it.
std::optional<Strides> view_strides(const Tensor& t, const Shape& shape);
// Resolves one -1 in `shape` from t's element count; checks the count matches.
Shape infer_shape(const Tensor& t, Shape shape, const char* op);
Tensor view(const Tensor& t, const Shape& shape);  // throws if not viewable
Tensor permute(const Tensor& t, const std::vector<std::int64_t>& dims);
Tensor slice(const Tensor& t, std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step);
Tensor select(const Tensor& t, std::int64_t dim, std::int64_t index);
Tensor expand(const Tensor& t, const Shape& shape);
Tensor unsqueeze(const Tensor& t, std::int64_t dim);
Tensor squeeze(const Tensor& t, std::int64_t dim);

}  // namespace kiln::views
