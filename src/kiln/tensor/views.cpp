#include "kiln/tensor/views.h"

#include <algorithm>

namespace kiln::views {

Shape infer_shape(const Tensor& t, Shape shape, const char* op) {
  std::int64_t known = 1;
  int infer = -1;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (shape[i] == -1) {
      KILN_CHECK(infer < 0, "{}: only one dimension can be -1 in {}", op, shape_str(shape));
      infer = i;
    } else {
      KILN_CHECK(shape[i] >= 0, "{}: invalid size {} in {}", op, shape[i], shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    KILN_CHECK(known != 0 && t.numel() % known == 0, "{}: shape {} is invalid for {} elements ({})", op,
               shape_str(shape), t.numel(), t.describe());
    shape[infer] = t.numel() / known;
  }
  KILN_CHECK(numel_of(shape) == t.numel(), "{}: shape {} is invalid for {} elements ({})", op, shape_str(shape),
             t.numel(), t.describe());
  return shape;
}

std::optional<Strides> view_strides(const Tensor& t, const Shape& shape) {
  if (t.is_contiguous()) return contiguous_strides(shape);
  // Match groups of old dimensions that are contiguous among themselves to groups of new ones
  // (the algorithm of PyTorch's computeStride).
  const Shape& old_shape = t.shape();
  const Strides& old_strides = t.strides();
  Strides out(shape.size());
  if (t.numel() == 0) return contiguous_strides(shape);
  std::int64_t view_d = static_cast<std::int64_t>(shape.size()) - 1;
  std::int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  std::int64_t tensor_numel = 1, view_numel = 1;
  for (std::int64_t d = static_cast<std::int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

Tensor view(const Tensor& t, const Shape& shape) {
  auto strides = view_strides(t, shape);
  KILN_CHECK(strides.has_value(), "view: {} cannot be viewed as {} without a copy (use reshape)", t.describe(),
             shape_str(shape));
  return make_view(t, shape, *strides, t.storage_offset());
}

Tensor permute(const Tensor& t, const std::vector<std::int64_t>& dims) {
  KILN_CHECK(static_cast<std::int64_t>(dims.size()) == t.dim(), "permute: {} dims given for {}", dims.size(),
             t.describe());
  Shape shape(dims.size());
  Strides strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    int d = wrap_dim(dims[i], t.dim(), "permute");
    KILN_CHECK(!seen[d], "permute: dimension {} repeated", d);
    seen[d] = true;
    shape[i] = t.shape()[d];
    strides[i] = t.strides()[d];
  }
  return make_view(t, std::move(shape), std::move(strides), t.storage_offset());
}

Tensor slice(const Tensor& t, std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step) {
  int d = wrap_dim(dim, t.dim(), "slice");
  KILN_CHECK(step > 0, "slice: step must be positive, got {}", step);
  std::int64_t n = t.shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<std::int64_t>(start, 0, n);
  end = std::clamp<std::int64_t>(end, start, n);
  Shape shape = t.shape();
  Strides strides = t.strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  return make_view(t, std::move(shape), std::move(strides), t.storage_offset() + start * t.strides()[d]);
}

Tensor select(const Tensor& t, std::int64_t dim, std::int64_t index) {
  int d = wrap_dim(dim, t.dim(), "select");
  std::int64_t n = t.shape()[d];
  KILN_CHECK(index >= -n && index < n, "select: index {} out of range for dimension {} of size {}", index, d, n);
  if (index < 0) index += n;
  Shape shape = t.shape();
  Strides strides = t.strides();
  std::int64_t offset = t.storage_offset() + index * strides[d];
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return make_view(t, std::move(shape), std::move(strides), offset);
}

Tensor expand(const Tensor& t, const Shape& shape) {
  KILN_CHECK(shape.size() >= t.shape().size(), "expand: cannot expand {} to {}", t.describe(), shape_str(shape));
  std::size_t lead = shape.size() - t.shape().size();
  Shape out_shape = shape;
  Strides strides(shape.size(), 0);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      KILN_CHECK(shape[i] >= 0, "expand: new leading dimension must be sized, got {}", shape_str(shape));
      continue;
    }
    std::int64_t have = t.shape()[i - lead];
    std::int64_t want = shape[i] == -1 ? have : shape[i];
    KILN_CHECK(want == have || have == 1, "expand: cannot expand {} to {}", t.describe(), shape_str(shape));
    out_shape[i] = want;
    strides[i] = want == have ? t.strides()[i - lead] : 0;
  }
  return make_view(t, std::move(out_shape), std::move(strides), t.storage_offset());
}

Tensor unsqueeze(const Tensor& t, std::int64_t dim) {
  int d = wrap_dim(dim, t.dim() + 1, "unsqueeze");
  Shape shape = t.shape();
  Strides strides = t.strides();
  std::int64_t stride = d < t.dim() ? strides[d] * shape[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return make_view(t, std::move(shape), std::move(strides), t.storage_offset());
}

Tensor squeeze(const Tensor& t, std::int64_t dim) {
  int d = wrap_dim(dim, t.dim(), "squeeze");
  if (t.shape()[d] != 1) return make_view(t, t.shape(), t.strides(), t.storage_offset());
  Shape shape = t.shape();
  Strides strides = t.strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return make_view(t, std::move(shape), std::move(strides), t.storage_offset());
}

}  // namespace kiln::views
