#include "kiln/ops/memory_format.h"

#include <algorithm>
#include <array>

#include "kiln/ops/copy.h"
#include "kiln/ops/kernels.h"

namespace kiln::ops {

bool is_non_overlapping_dense(const Tensor& t) {
  if (t.is_contiguous()) return true;
  const std::size_t nd = t.shape().size();
  // Dimensions of size > 1, ordered by stride: dense when each stride is the product of the
  // sizes of the dimensions with smaller strides.
  std::array<std::size_t, 16> order{};
  if (nd > order.size()) return false;
  std::size_t m = 0;
  for (std::size_t i = 0; i < nd; ++i)
    if (t.shape()[i] != 1) order[m++] = i;
  std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(m),
            [&t](std::size_t a, std::size_t b) { return t.strides()[a] < t.strides()[b]; });
  std::int64_t expected = 1;
  for (std::size_t k = 0; k < m; ++k) {
    if (t.strides()[order[k]] != expected) return false;
    expected *= t.shape()[order[k]];
  }
  return true;
}

bool is_channels_last(const Tensor& t) {
  if (t.dim() != 4) return false;
  const auto& s = t.shape();
  const auto& st = t.strides();
  const std::int64_t n = s[0], c = s[1], h = s[2], w = s[3];
  return (n == 1 || st[0] == h * w * c) && (c == 1 || st[1] == 1) && (h == 1 || st[2] == w * c) &&
         (w == 1 || st[3] == c);
}

Tensor empty_channels_last(const Shape& shape, DType dtype, Device device) {
  KILN_CHECK(shape.size() == 4, "empty_channels_last: shape {} is not [N, C, H, W]", shape_str(shape));
  Tensor nhwc = Tensor::empty({shape[0], shape[2], shape[3], shape[1]}, dtype, device);
  const std::int64_t c = shape[1], h = shape[2], w = shape[3];
  return make_view(nhwc, shape, Strides{h * w * c, 1, w * c, c}, nhwc.storage_offset());
}

Tensor to_channels_last(const Tensor& t) {
  KILN_CHECK(t.dim() == 4, "to_channels_last: {} is not [N, C, H, W]", t.describe());
  if (is_channels_last(t)) return t;
  Tensor out = empty_channels_last(t.shape(), t.dtype(), t.device());
  if (out.numel()) KILN_KERNEL(t.device(), copy)(t, out);
  return out;
}

Tensor empty_like_dense(const Tensor& t, DType dtype) {
  if (t.is_contiguous() || !is_non_overlapping_dense(t)) return Tensor::empty(t.shape(), dtype, t.device());
  Tensor flat = Tensor::empty({t.numel()}, dtype, t.device());
  return make_view(flat, t.shape(), t.strides(), flat.storage_offset());
}

Tensor flat_dense_view(const Tensor& t) { return make_view(t, Shape{t.numel()}, Strides{1}, t.storage_offset()); }

bool same_dense_layout(const Tensor& a, const Tensor& b) {
  // Contiguous first: the common operands leave after one check.
  return !a.is_contiguous() && a.shape() == b.shape() && a.strides() == b.strides() && is_non_overlapping_dense(a);
}

}  // namespace kiln::ops
