// The differentiable view and copy methods of Tensor. Each view's backward maps the gradient
// back onto the input's shape.
#include "kiln/tensor/views.h"

#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/memory_format.h"

namespace kiln {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;

namespace {

// y = a view of x; backward reshapes the gradient back to x's shape: as a view when the gradient's
// strides allow it (a strided gradient, such as one part of a packed buffer, is not copied), else
// a contiguous copy.
Tensor record_reshape(Tensor y, const Tensor& x, const char* node) {
  if (needs_grad({x})) {
    record(node, {x}, {&y}, [shape = x.shape()](const Grads& g) -> Grads {
      if (auto strides = views::view_strides(g[0], shape))
        return {make_view(g[0], shape, *strides, g[0].storage_offset())};
      return {ops::contiguous_view(g[0], shape)};
    });
  }
  return y;
}

// y = x[region]; backward scatters the gradient into zeros shaped like x.
template <class MakeRegion>
Tensor record_region(Tensor y, const Tensor& x, const char* node, MakeRegion region) {
  if (needs_grad({x})) {
    record(node, {x}, {&y}, [shape = x.shape(), region](const Grads& g) -> Grads {
      Tensor gx = Tensor::zeros(shape, g[0].dtype(), g[0].device());
      ops::copy_into(region(gx), g[0]);
      return {gx};
    });
  }
  return y;
}

}  // namespace

Tensor Tensor::view(Shape shape) const {
  return record_reshape(views::view(*this, views::infer_shape(*this, std::move(shape), "view")), *this, "ViewBackward");
}

Tensor Tensor::reshape(Shape shape) const {
  shape = views::infer_shape(*this, std::move(shape), "reshape");
  if (auto strides = views::view_strides(*this, shape))
    return record_reshape(make_view(*this, shape, *strides, storage_offset()), *this, "ReshapeBackward");
  return contiguous().view(std::move(shape));
}

Tensor Tensor::flatten(std::int64_t start_dim, std::int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  int s = wrap_dim(start_dim, dim(), "flatten"), e = wrap_dim(end_dim, dim(), "flatten");
  KILN_CHECK(s <= e, "flatten: start_dim {} is after end_dim {}", s, e);
  Shape out(shape().begin(), shape().begin() + s);
  std::int64_t merged = 1;
  for (int d = s; d <= e; ++d) merged *= shape()[d];
  out.push_back(merged);
  out.insert(out.end(), shape().begin() + e + 1, shape().end());
  return reshape(std::move(out));
}

Tensor Tensor::permute(std::vector<std::int64_t> dims) const {
  Tensor y = views::permute(*this, dims);
  if (needs_grad({*this})) {
    std::vector<std::int64_t> inverse(dims.size());
    for (std::size_t i = 0; i < dims.size(); ++i)
      inverse[wrap_dim(dims[i], dim(), "permute")] = static_cast<std::int64_t>(i);
    record("PermuteBackward", {*this}, {&y},
           [inverse](const Grads& g) -> Grads { return {views::permute(g[0], inverse)}; });
  }
  return y;
}

Tensor Tensor::transpose(std::int64_t d0, std::int64_t d1) const {
  std::vector<std::int64_t> dims(static_cast<std::size_t>(dim()));
  for (std::int64_t i = 0; i < dim(); ++i) dims[i] = i;
  std::swap(dims[wrap_dim(d0, dim(), "transpose")], dims[wrap_dim(d1, dim(), "transpose")]);
  return permute(std::move(dims));
}

Tensor Tensor::slice(std::int64_t d, std::int64_t start, std::int64_t end, std::int64_t step) const {
  return record_region(views::slice(*this, d, start, end, step), *this, "SliceBackward",
                       [=](const Tensor& t) { return views::slice(t, d, start, end, step); });
}

Tensor Tensor::narrow(std::int64_t d, std::int64_t start, std::int64_t length) const {
  int w = wrap_dim(d, dim(), "narrow");
  KILN_CHECK(start >= 0 && length >= 0 && start + length <= shape()[w],
             "narrow: [{}, {}) is outside dimension {} of size {}", start, start + length, w, shape()[w]);
  return slice(d, start, start + length);
}

Tensor Tensor::select(std::int64_t d, std::int64_t index) const {
  return record_region(views::select(*this, d, index), *this, "SelectBackward",
                       [=](const Tensor& t) { return views::select(t, d, index); });
}

Tensor Tensor::expand(Shape shape) const {
  Tensor y = views::expand(*this, shape);
  if (needs_grad({*this})) {
    record("ExpandBackward", {*this}, {&y},
           [s = this->shape()](const Grads& g) -> Grads { return {ops::sum_to_shape(g[0], s)}; });
  }
  return y;
}

Tensor Tensor::squeeze(std::int64_t d) const {
  return record_reshape(views::squeeze(*this, d), *this, "SqueezeBackward");
}

Tensor Tensor::squeeze() const {
  Shape out;
  for (auto s : shape())
    if (s != 1) out.push_back(s);
  return reshape(std::move(out));
}

Tensor Tensor::unsqueeze(std::int64_t d) const {
  return record_reshape(views::unsqueeze(*this, d), *this, "UnsqueezeBackward");
}

Tensor to_channels_last(const Tensor& x) {
  Tensor y = ops::to_channels_last(x);
  if (y.is_same(x)) return x;
  if (needs_grad({x})) record("ToChannelsLastBackward", {x}, {&y}, [](const Grads& g) -> Grads { return {g[0]}; });
  return y;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor y = empty_like(*this);
  ops::copy_into(y, *this);
  if (needs_grad({*this})) record("CloneBackward", {*this}, {&y}, [](const Grads& g) -> Grads { return {g[0]}; });
  return y;
}

Tensor Tensor::to(Device device) const { return to(device, dtype()); }
Tensor Tensor::to(DType dtype) const { return to(device(), dtype); }

Tensor Tensor::to(Device device, DType dtype) const {
  Tensor y = ops::to(*this, device, dtype);
  if (y.is_same(*this)) return y;
  if (needs_grad({*this}) && is_floating(dtype)) {
    record("ToBackward", {*this}, {&y},
           [d = this->device(), t = this->dtype()](const Grads& g) -> Grads { return {ops::to(g[0], d, t)}; });
  }
  return y;
}

}  // namespace kiln
