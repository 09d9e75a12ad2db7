// Differentiable dropout (counter-based Bernoulli mask from the random kernel) and embedding
// (index_select forward, index_add backward).
#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/checks.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/indexing.h"
#include "kiln/ops/kernels.h"

namespace kiln {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;
using ops::BinaryOp;

namespace {

// y = x * mask / (1 - p) with its backward; `make_mask` fills mask[i] = 1 with probability 1 - p.
template <class MakeMask>
Tensor masked_dropout(const Tensor& x, double p, MakeMask&& make_mask) {
  Tensor mask = empty_like(x);
  if (mask.numel()) make_mask(mask);
  const double scale = 1.0 / (1.0 - p);
  Tensor y = ops::binary(BinaryOp::Mul, x, mask);
  ops::binary_(BinaryOp::Mul, y, scale);
  if (needs_grad({x})) {
    record("DropoutBackward", {x}, {&y}, [mask, scale](const Grads& g) -> Grads {
      if (!g[0].defined()) return {Tensor()};
      Tensor gx = ops::binary(BinaryOp::Mul, g[0], mask);
      ops::binary_(BinaryOp::Mul, gx, scale);
      return {gx};
    });
  }
  return y;
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, std::uint64_t seed, std::uint64_t offset) {
  KILN_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got {}", p);
  ops::check_defined("dropout", x, "input");
  if (!training || p == 0.0) return x;
  ops::check_floating("dropout", x);
  if (p == 1.0) return mul(x, 0.0);
  // mask[i] = 1 with probability 1 - p (element i of the Philox stream at `offset`).
  return masked_dropout(x, p, [&](const Tensor& mask) {
    KILN_KERNEL(x.device(), random)(mask, ops::RandomKind::Bernoulli, seed, offset, 1.0 - p, 0.0);
  });
}

Tensor dropout_advancing(const Tensor& x, double p, std::uint64_t seed, const Tensor& offset) {
  KILN_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got {}", p);
  ops::check_defined("dropout", x, "input");
  ops::check_defined("dropout", offset, "offset");
  KILN_CHECK(offset.dtype() == DType::I64 && offset.numel() == 1 && offset.device() == x.device(),
             "dropout: the offset counter must be an int64 scalar on {}, got {}", x.device().str(), offset.describe());
  Tensor y;
  if (p == 0.0) {
    y = x;
  } else {
    ops::check_floating("dropout", x);
    if (p == 1.0) {
      y = mul(x, 0.0);
    } else {
      y = masked_dropout(x, p, [&](const Tensor& mask) {
        KILN_KERNEL(x.device(), random_device_offset)(mask, ops::RandomKind::Bernoulli, seed, offset, 1.0 - p, 0.0);
      });
    }
  }
  // Advance on the device, in stream order after the mask kernel (exact below 2^53).
  ops::binary_(BinaryOp::Add, offset, static_cast<double>(x.numel()));
  return y;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  ops::check_defined("embedding", weight, "weight");
  ops::check_defined("embedding", indices, "indices");
  KILN_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, dim], got {}", weight.describe());
  KILN_CHECK(indices.dtype() == DType::I64 || indices.dtype() == DType::I32,
             "embedding: indices must be int64 or int32, got {}", indices.describe());
  Tensor flat = ops::contiguous(ops::to(indices, indices.device(), DType::I64));
  flat = make_view(flat, {flat.numel()}, {1}, flat.storage_offset());
  Tensor rows = ops::index_select(weight, 0, flat);  // [n, dim]
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.shape()[1]);
  Tensor y = make_view(rows, out_shape, contiguous_strides(out_shape), rows.storage_offset());
  if (needs_grad({weight})) {
    record("EmbeddingBackward", {weight}, {&y},
           [flat, wshape = weight.shape(), n = flat.numel()](const Grads& g) -> Grads {
             if (!g[0].defined()) return {Tensor()};
             Tensor gw = Tensor::zeros(wshape, g[0].dtype(), g[0].device());
             Tensor gc = ops::contiguous(g[0]);
             ops::index_add_(gw, 0, flat, make_view(gc, {n, wshape[1]}, {wshape[1], 1}, gc.storage_offset()));
             return {gw};
           });
  }
  return y;
}

}  // namespace kiln
