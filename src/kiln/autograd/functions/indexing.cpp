// Differentiable joining, splitting and indexing: cat/stack (backward: slices of the gradient),
// split (narrow views), index_select/gather (backward: index_add/scatter_add into zeros),
// scatter_add and topk (values differentiable: the gradient is scattered to the indices).
#include "kiln/ops/indexing.h"

#include <optional>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/checks.h"
#include "kiln/ops/copy.h"
#include "kiln/tensor/views.h"

namespace kiln {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;

Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim) {
  KILN_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  const Tensor& first = tensors[0];
  ops::check_defined("cat", first, "tensor 0");
  const int d = wrap_dim(dim, std::max<std::int64_t>(first.dim(), 1), "cat");
  KILN_CHECK(first.dim() > 0, "cat: zero-dimensional tensor {} cannot be concatenated", first.describe());
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    ops::check_defined("cat", t, "a tensor");
    ops::check_compatible("cat", first, t);
    bool ok = t.dim() == first.dim();
    for (std::int64_t k = 0; ok && k < t.dim(); ++k) ok = k == d || t.shape()[k] == first.shape()[k];
    KILN_CHECK(ok, "cat: tensor {} is {} but tensor 0 is {}: sizes must match except in dimension {}", i, t.describe(),
               first.describe(), d);
    out_shape[d] += t.shape()[d];
  }
  Tensor y = Tensor::empty(out_shape, first.dtype(), first.device());
  std::vector<std::int64_t> offsets;
  std::int64_t off = 0;
  for (const Tensor& t : tensors) {
    offsets.push_back(off);
    if (t.numel()) ops::copy_into(views::slice(y, d, off, off + t.shape()[d], 1), t);
    off += t.shape()[d];
  }
  if (needs_grad(tensors)) {
    std::vector<std::int64_t> sizes;
    for (const Tensor& t : tensors) sizes.push_back(t.shape()[d]);
    record("CatBackward", tensors, {&y}, [d, offsets, sizes](const Grads& g) -> Grads {
      Grads out(sizes.size());
      if (!g[0].defined()) return out;
      for (std::size_t i = 0; i < sizes.size(); ++i)
        out[i] = views::slice(g[0], d, offsets[i], offsets[i] + sizes[i], 1);
      return out;
    });
  }
  return y;
}

Tensor stack(const std::vector<Tensor>& tensors, std::int64_t dim) {
  KILN_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  const int d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    KILN_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: tensor {} is {} but tensor 0 is {}", i,
               tensors[i].describe(), tensors[0].describe());
    expanded.push_back(tensors[i].unsqueeze(d));
  }
  return cat(expanded, d);
}

std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim) {
  KILN_CHECK(split_size > 0, "split: split_size must be positive, got {}", split_size);
  const int d = wrap_dim(dim, x.dim(), "split");
  std::vector<Tensor> out;
  const std::int64_t n = x.shape()[d];
  for (std::int64_t start = 0; start < n || (n == 0 && out.empty()); start += split_size)
    out.push_back(x.narrow(d, start, std::min(split_size, n - start)));
  return out;
}

namespace {

// The gradient of the whole when the parts' gradients are views that tile one buffer exactly as
// the parts tile a contiguous `shape` (what a kernel writing a packed gradient, such as the
// attention backward's dq/dk/dv into one dqkv buffer, hands back): a view of that buffer, no copy.
std::optional<Tensor> tiled_whole(const Grads& g, const Shape& shape, int d, const std::vector<std::int64_t>& sizes) {
  const Strides whole_strides = contiguous_strides(shape);
  const Tensor& first = g[0];
  if (!first.defined()) return std::nullopt;
  std::int64_t start = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Tensor& gi = g[i];
    if (!gi.defined() || gi.storage() != first.storage() || gi.dtype() != first.dtype()) return std::nullopt;
    if (gi.storage_offset() != first.storage_offset() + start * whole_strides[d]) return std::nullopt;
    for (int k = 0; k < gi.dim(); ++k)
      if (gi.shape()[k] > 1 && gi.strides()[k] != whole_strides[k]) return std::nullopt;
    start += sizes[i];
  }
  return make_view(first, shape, whole_strides, first.storage_offset());
}

}  // namespace

// One node for all parts: its backward writes each part's gradient into one buffer (zeros only
// where a part got none), rather than a zero-filled buffer per part summed afterwards.
std::vector<Tensor> split_sizes(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t dim) {
  const int d = wrap_dim(dim, x.dim(), "split_sizes");
  std::int64_t total = 0;
  for (auto s : sizes) {
    KILN_CHECK(s >= 0, "split_sizes: sizes must be non-negative, got {}", s);
    total += s;
  }
  KILN_CHECK(total == x.shape()[d], "split_sizes: sizes sum to {} but dimension {} of {} has size {}", total, d,
             x.describe(), x.shape()[d]);
  std::vector<Tensor> out;
  std::int64_t start = 0;
  for (auto s : sizes) {
    out.push_back(views::slice(x, d, start, start + s, 1));
    start += s;
  }
  if (needs_grad({x})) {
    std::vector<Tensor*> outputs;
    for (Tensor& t : out) outputs.push_back(&t);
    record("SplitBackward", std::vector<Tensor>{x}, outputs, [shape = x.shape(), d, sizes](const Grads& g) -> Grads {
      const Tensor* any = nullptr;
      for (const Tensor& gi : g)
        if (gi.defined()) any = &gi;
      if (any == nullptr) return {Tensor()};
      if (std::optional<Tensor> whole = tiled_whole(g, shape, d, sizes)) return {*whole};
      Tensor gx = Tensor::empty(shape, any->dtype(), any->device());
      std::int64_t begin = 0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        Tensor region = views::slice(gx, d, begin, begin + sizes[i], 1);
        if (g[i].defined())
          ops::copy_into(region, g[i]);
        else
          region.zero_();
        begin += sizes[i];
      }
      return {gx};
    });
  }
  return out;
}

Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& index) {
  Tensor y = ops::index_select(x, dim, index);
  if (needs_grad({x})) {
    const int d = wrap_dim(dim, x.dim(), "index_select");
    record("IndexSelectBackward", {x}, {&y}, [d, index, shape = x.shape()](const Grads& g) -> Grads {
      if (!g[0].defined()) return {Tensor()};
      Tensor gx = Tensor::zeros(shape, g[0].dtype(), g[0].device());
      ops::index_add_(gx, d, index, g[0]);
      return {gx};
    });
  }
  return y;
}

Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index) {
  Tensor y = ops::gather(x, dim, index);
  if (needs_grad({x})) {
    record("GatherBackward", {x}, {&y}, [dim, index, shape = x.shape()](const Grads& g) -> Grads {
      if (!g[0].defined()) return {Tensor()};
      Tensor gx = Tensor::zeros(shape, g[0].dtype(), g[0].device());
      ops::scatter_add_(gx, dim, index, g[0]);
      return {gx};
    });
  }
  return y;
}

Tensor scatter_add(const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src) {
  ops::check_defined("scatter_add", x, "input");
  Tensor y = empty_like(x);
  ops::copy_into(y, x);
  ops::scatter_add_(y, dim, index, src);
  if (needs_grad({x, src})) {
    record("ScatterAddBackward", {x, src}, {&y},
           [dim, index, src_shape = src.shape(), gs = src.requires_grad()](const Grads& g) -> Grads {
             if (!g[0].defined()) return {Tensor(), Tensor()};
             Grads out{g[0], Tensor()};
             if (gs) {
               // src positions outside index's extent do not reach the output: zero gradient there.
               Tensor gsrc = Tensor::zeros(src_shape, g[0].dtype(), g[0].device());
               Tensor region = make_view(gsrc, index.shape(), gsrc.strides(), 0);
               ops::copy_into(region, ops::gather(g[0], dim, index));
               out[1] = gsrc;
             }
             return out;
           });
  }
  return y;
}

std::pair<Tensor, Tensor> topk(const Tensor& x, std::int64_t k, bool largest) {
  auto [values, indices] = ops::topk(x, k, largest);
  if (needs_grad({x})) {
    record("TopkBackward", {x}, {&values}, [indices, shape = x.shape()](const Grads& g) -> Grads {
      if (!g[0].defined()) return {Tensor()};
      Tensor gx = Tensor::zeros(shape, g[0].dtype(), g[0].device());
      ops::scatter_add_(gx, -1, indices, g[0]);
      return {gx};
    });
  }
  return {values, indices};
}

}  // namespace kiln
