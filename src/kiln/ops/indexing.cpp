#include "kiln/ops/indexing.h"

#include "kiln/ops/checks.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/kernels.h"

namespace kiln::ops {

namespace {

void check_index(const char* op, const Tensor& x, const Tensor& index) {
  check_defined(op, x, "input");
  check_defined(op, index, "index");
  check_same_device(op, x, index);
  KILN_CHECK(index.dtype() == DType::I64, "{}: index must be int64, got {}", op, index.describe());
}

// gather/scatter_add: index has x's rank, fits inside x on every dimension but `dim` and inside `bound`
// (when defined) on every dimension.
void check_gather_shape(const char* op, const Tensor& x, const Tensor& index, int dim, const Tensor& bound,
                        const char* bound_name) {
  KILN_CHECK(index.dim() == x.dim(), "{}: index {} must have as many dimensions as input {}", op, index.describe(),
             x.describe());
  for (int d = 0; d < index.dim(); ++d) {
    KILN_CHECK(d == dim || index.shape()[d] <= x.shape()[d], "{}: index {} is larger than input {} in dimension {}", op,
               index.describe(), x.describe(), d);
    if (bound.defined())
      KILN_CHECK(index.shape()[d] <= bound.shape()[d], "{}: index {} is larger than {} {} in dimension {}", op,
                 index.describe(), bound_name, bound.describe(), d);
  }
}

Tensor flat(const Tensor& index) {
  Tensor c = contiguous(index);
  return make_view(c, {c.numel()}, {1}, c.storage_offset());
}

}  // namespace

Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& index) {
  check_index("index_select", x, index);
  KILN_CHECK(index.dim() <= 1, "index_select: index must be 1-D, got {}", index.describe());
  KILN_CHECK(x.dim() >= 1, "index_select: input must have at least one dimension, got {}", x.describe());
  const int d = wrap_dim(dim, x.dim(), "index_select");
  Shape s = x.shape();
  s[d] = index.numel();
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  KILN_CHECK(x.shape()[d] > 0, "index_select: cannot select from the empty dimension {} of {}", d, x.describe());
  KILN_KERNEL(x.device(), index_select)(x, d, flat(index), out);
  return out;
}

void index_add_(const Tensor& out, std::int64_t dim, const Tensor& index, const Tensor& src) {
  check_index("index_add_", out, index);
  check_compatible("index_add_", out, src);
  KILN_CHECK(index.dim() <= 1, "index_add_: index must be 1-D, got {}", index.describe());
  KILN_CHECK(out.is_contiguous(), "index_add_: the destination must be contiguous, got {}", out.describe());
  const int d = wrap_dim(dim, out.dim(), "index_add_");
  Shape expected = out.shape();
  expected[d] = index.numel();
  KILN_CHECK(src.shape() == expected, "index_add_: source {} does not match {} (expected {})", src.describe(),
             out.describe(), shape_str(expected));
  if (src.numel() == 0) return;
  KILN_KERNEL(out.device(), index_add)(out, d, flat(index), src);
  out.storage()->bump_version();
}

Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index) {
  check_index("gather", x, index);
  const int d = wrap_dim(dim, std::max<std::int64_t>(x.dim(), 1), "gather");
  check_gather_shape("gather", x, index, d, Tensor(), "");
  Tensor out = Tensor::empty(index.shape(), x.dtype(), x.device());
  if (out.numel()) KILN_KERNEL(x.device(), gather)(x, d, contiguous(index), out);
  return out;
}

void scatter_add_(const Tensor& out, std::int64_t dim, const Tensor& index, const Tensor& src) {
  check_index("scatter_add_", out, index);
  check_compatible("scatter_add_", out, src);
  KILN_CHECK(out.is_contiguous(), "scatter_add_: the destination must be contiguous, got {}", out.describe());
  const int d = wrap_dim(dim, std::max<std::int64_t>(out.dim(), 1), "scatter_add_");
  check_gather_shape("scatter_add_", out, index, d, src, "source");
  if (index.numel() == 0) return;
  KILN_KERNEL(out.device(), scatter_add)(out, d, contiguous(index), src);
  out.storage()->bump_version();
}

std::pair<Tensor, Tensor> topk(const Tensor& x, std::int64_t k, bool largest) {
  check_defined("topk", x, "input");
  KILN_CHECK(x.dim() >= 1, "topk: input must have at least one dimension, got {}", x.describe());
  const std::int64_t n = x.shape().back();
  KILN_CHECK(k >= 0 && k <= n, "topk: k = {} is out of range for the last dimension of {}", k, x.describe());
  Shape s = x.shape();
  if (!s.empty()) s.back() = k;
  Tensor values = Tensor::empty(s, x.dtype(), x.device());
  Tensor indices = Tensor::empty(s, DType::I64, x.device());
  if (values.numel()) KILN_KERNEL(x.device(), topk)(contiguous(x), k, largest, values, indices);
  return {values, indices};
}

}  // namespace kiln::ops
