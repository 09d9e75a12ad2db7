#pragma once
// Shapes and strides (in elements) and the arithmetic on them that every layer needs.
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace kiln {

using Shape = std::vector<std::int64_t>;
using Strides = std::vector<std::int64_t>;

std::int64_t numel_of(std::span<const std::int64_t> shape);
Strides contiguous_strides(std::span<const std::int64_t> shape);
std::string shape_str(std::span<const std::int64_t> shape);  // "[2, 3]"
// Wraps a possibly negative dimension index; throws naming `op` when out of range.
int wrap_dim(std::int64_t dim, std::int64_t ndim, const char* op);
// NumPy broadcasting of two shapes; throws naming `op` and both shapes when incompatible.
Shape broadcast_shapes(std::span<const std::int64_t> a, std::span<const std::int64_t> b, const char* op);

}  // namespace kiln
