#include "kiln/tensor/shape.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "kiln/runtime/error.h"

namespace kiln {

std::int64_t numel_of(std::span<const std::int64_t> shape) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

Strides contiguous_strides(std::span<const std::int64_t> shape) {
  Strides strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<std::int64_t>(shape[i], 1);
  }
  return strides;
}

std::string shape_str(std::span<const std::int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

int wrap_dim(std::int64_t dim, std::int64_t ndim, const char* op) {
  std::int64_t lo = -std::max<std::int64_t>(ndim, 1), hi = std::max<std::int64_t>(ndim, 1) - 1;
  KILN_CHECK(dim >= lo && dim <= hi, "{}: dimension {} out of range for a tensor of {} dimensions", op, dim, ndim);
  return static_cast<int>(dim < 0 ? dim + std::max<std::int64_t>(ndim, 1) : dim);
}

Shape broadcast_shapes(std::span<const std::int64_t> a, std::span<const std::int64_t> b, const char* op) {
  std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(da == db || da == 1 || db == 1, "{}: shapes {} and {} cannot be broadcast together", op, shape_str(a),
               shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace kiln
