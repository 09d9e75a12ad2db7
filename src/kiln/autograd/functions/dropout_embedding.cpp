// Differentiable dropout (counter-based Bernoulli mask from the random kernel) and embedding
// (index_select forward, index_add backward).
#include "kiln/autograd/functions.h"
#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/checks.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/indexing.h"
#include "kiln/ops/kernels.h"
#include "kiln/ops/linalg.h"

namespace kiln {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;
using ops::BinaryOp;

namespace {

// The embedding's weight gradient as one GEMM, onehot[rows, n] x grad[n, dim], where index_add's
// atomics would serialise: a small table's rows are each hit by many tokens (a character-level
// vocabulary: ~100 rows for thousands of tokens; learned positions: one row per sequence of the
// batch), and on a GPU every token's row then waits on the same addresses, in bf16 rounding at each
// addition (measured: 3.2 ms a call, 31% of a GPT-2-124M step on a 384-row vocabulary, H200). The
// GEMM weights are exact (0 or 1), cuBLAS accumulates in fp32 and the result is deterministic.
// Only where the one-hot matrix is small (<= 64 MiB); larger tables spread the tokens over more rows.
bool embedding_gradient_as_gemm(const Shape& weight_shape, std::int64_t n, DType dtype, Device device) {
  if (!device.is_cuda() || (dtype != DType::BF16 && dtype != DType::F16)) return false;
  return weight_shape[0] * n * static_cast<std::int64_t>(dtype_size(dtype)) <= (std::int64_t{64} << 20);
}

// onehot x grad into a new tensor, or added into `main_grad` (an fp32 [rows, dim] buffer:
// gradient-accumulation fusion) when it is given; returns the new tensor, or main_grad.
Tensor embedding_gradient_gemm(const Tensor& flat_indices, const Shape& weight_shape, const Tensor& grad_rows,
                               const Tensor& main_grad = Tensor()) {
  const std::int64_t n = flat_indices.numel(), rows = weight_shape[0];
  Tensor onehot = Tensor::zeros({1, rows, n}, grad_rows.dtype(), grad_rows.device());
  const Tensor plane = make_view(onehot, {rows, n}, {n, 1}, onehot.storage_offset());
  ops::scatter_add_(plane, 0, make_view(flat_indices, {1, n}, {n, 1}, flat_indices.storage_offset()),
                    Tensor::ones({1, n}, grad_rows.dtype(), grad_rows.device()));
  Tensor g = make_view(grad_rows, {1, n, weight_shape[1]}, {n * weight_shape[1], weight_shape[1], 1},
                       grad_rows.storage_offset());
  if (main_grad.defined()) {
    const Shape batched{1, rows, weight_shape[1]};
    ops::gemm_into(onehot, g, make_view(main_grad, batched, contiguous_strides(batched), main_grad.storage_offset()),
                   false, false, 1.0, 1.0);
    return main_grad;
  }
  Tensor gw = ops::gemm(onehot, g, false, false);  // [1, rows, dim]
  return make_view(gw, weight_shape, contiguous_strides(weight_shape), gw.storage_offset());
}

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
           [flat, wshape = weight.shape(), n = flat.numel(),
            leaf = weight.is_leaf() ? weight : Tensor()](const Grads& g) -> Grads {
             if (!g[0].defined()) return {Tensor()};
             Tensor gc = ops::contiguous(g[0]);
             const Tensor rows = make_view(gc, {n, wshape[1]}, {wshape[1], 1}, gc.storage_offset());
             const bool as_gemm = embedding_gradient_as_gemm(wshape, n, gc.dtype(), gc.device());
             // Gradient-accumulation fusion: the rows go straight into the fp32 main gradient (fp32
             // atomics or the GEMM's fp32 output), not into a bf16 table a pass then adds.
             if (const Tensor main_grad = autograd::fusable_main_grad(leaf); main_grad.defined()) {
               if (as_gemm)
                 embedding_gradient_gemm(flat, wshape, rows, main_grad);
               else
                 ops::index_add_(main_grad, 0, flat, ops::to(rows, rows.device(), DType::F32));
               autograd::note_main_grad_accumulated(leaf);
               return {Tensor()};
             }
             if (as_gemm) return {embedding_gradient_gemm(flat, wshape, rows)};
             Tensor gw = Tensor::zeros(wshape, g[0].dtype(), g[0].device());
             ops::index_add_(gw, 0, flat, rows);
             return {gw};
           });
  }
  return y;
}

}  // namespace kiln
