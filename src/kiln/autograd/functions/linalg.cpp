// Differentiable matmul, bmm and linear. Backward: dA = dC B^T, dB = A^T dC (transposes are
// GEMM flags, never copies).
#include "kiln/ops/linalg.h"

#include "kiln/autograd/functions.h"
#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/autograd/record.h"
#include "kiln/autograd/weight_grad_store.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "kiln/tensor/autocast.h"
#include "kiln/tensor/views.h"

namespace kiln {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;

Tensor autocast_input(const Tensor& t) {
  std::optional<DType> dtype = autocast_dtype();
  if (!dtype || !t.defined() || !is_floating(t.dtype()) || t.dtype() == *dtype) return t;
  return t.to(*dtype);
}

Tensor bmm(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = autocast_input(a_in), b = autocast_input(b_in);
  KILN_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D operands, got {} and {}", a.describe(), b.describe());
  Tensor ac = ops::contiguous(a), bc = ops::contiguous(b);
  Tensor y = ops::gemm(ac, bc, false, false);
  if (needs_grad({a, b})) {
    record("BmmBackward", {a, b}, {&y},
           [sa = SavedTensor(ac.detach()), sb = SavedTensor(bc.detach()), ga = a.requires_grad(),
            gb = b.requires_grad()](const Grads& g) -> Grads {
             Tensor gc = ops::contiguous(g[0]);
             Grads out(2);
             if (ga) out[0] = ops::gemm(gc, sb.get("bmm"), false, true);
             if (gb) out[1] = ops::gemm(sa.get("bmm"), gc, true, false);
             return out;
           });
  }
  return y;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least one dimension, got {} and {}",
             a.describe(), b.describe());
  if (a.dim() <= 2 && b.dim() <= 2) {
    // [M,K] x [K,N] (vectors are promoted and the added dimension removed afterwards).
    Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
    Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
    KILN_CHECK(a2.shape()[1] == b2.shape()[0], "matmul: shapes {} and {} cannot be multiplied ({} != {})",
               shape_str(a.shape()), shape_str(b.shape()), a2.shape()[1], b2.shape()[0]);
    Tensor y = bmm(a2.unsqueeze(0), b2.unsqueeze(0)).squeeze(0);
    if (a.dim() == 1) y = y.squeeze(0);
    if (b.dim() == 1) y = y.squeeze(-1);
    return y;
  }
  // Batched: broadcast the batch dimensions, then one bmm.
  Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  Shape ba(a2.shape().begin(), a2.shape().end() - 2), bb(b2.shape().begin(), b2.shape().end() - 2);
  Shape batch = broadcast_shapes(ba, bb, "matmul");
  std::int64_t nb = numel_of(batch);
  std::int64_t m = a2.shape()[a2.dim() - 2], k = a2.shape()[a2.dim() - 1], n = b2.shape()[b2.dim() - 1];
  KILN_CHECK(b2.shape()[b2.dim() - 2] == k, "matmul: shapes {} and {} cannot be multiplied ({} != {})",
             shape_str(a.shape()), shape_str(b.shape()), k, b2.shape()[b2.dim() - 2]);
  Shape ea = batch, eb = batch;
  ea.push_back(m);
  ea.push_back(k);
  eb.push_back(k);
  eb.push_back(n);
  Tensor y = bmm(a2.expand(ea).reshape({nb, m, k}), b2.expand(eb).reshape({nb, k, n}));
  Shape out = batch;
  if (a.dim() > 1) out.push_back(m);
  if (b.dim() > 1) out.push_back(n);
  return y.reshape(out);
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  const Tensor x = autocast_input(x_in), weight = autocast_input(weight_in), bias = autocast_input(bias_in);
  KILN_CHECK(weight.dim() == 2, "linear: weight must be 2-D [out, in], got {}", weight.describe());
  KILN_CHECK(x.dim() >= 1 && x.shape().back() == weight.shape()[1],
             "linear: input {} does not match weight {} (expected last dimension {})", x.describe(), weight.describe(),
             weight.shape()[1]);
  if (bias.defined())
    KILN_CHECK(bias.dim() == 1 && bias.shape()[0] == weight.shape()[0], "linear: bias {} does not match weight {}",
               bias.describe(), weight.describe());
  const std::int64_t in = weight.shape()[1], out = weight.shape()[0];
  const std::int64_t rows = x.numel() / std::max<std::int64_t>(in, 1);
  Tensor x2 = ops::contiguous_view(x, {1, rows, in});
  Tensor w3 = ops::contiguous_view(weight, {1, out, in});
  // [1, rows, out]; the bias in the GEMM's epilogue (one pass over y, not two)
  Tensor y =
      bias.defined() ? ops::gemm_bias(x2, w3, ops::contiguous(bias), false, true) : ops::gemm(x2, w3, false, true);
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(out);
  y = make_view(y, out_shape, contiguous_strides(out_shape), 0);
  if (needs_grad({x, weight, bias})) {
    // Leaves (parameters used directly) can have their gradients deferred into a weight-gradient
    // store (zero-bubble pipelines' W pass); anything else gets its gradient in this backward.
    const bool gw = weight.requires_grad(), gb = bias.defined() && bias.requires_grad();
    const bool deferrable = (gw || gb) && (!gw || weight.is_leaf()) && (!gb || bias.is_leaf());
    record("LinearBackward", {x, weight, bias}, {&y},
           [sx = SavedTensor(x2.detach()), sw = SavedTensor(w3.detach()), xs = x.shape(), gx = x.requires_grad(), gw,
            gb, deferrable, weight_leaf = gw && weight.is_leaf() ? weight : Tensor(),
            bias_leaf = deferrable && gb ? bias : Tensor(), rows, in, out](const Grads& g) -> Grads {
             Tensor g3 = ops::contiguous_view(g[0], {1, rows, out});
             Grads res(3);
             if (gx) res[0] = ops::contiguous_view(ops::gemm(g3, sw.get("linear"), false, false), xs);
             // Undefined when the GEMM added it into the weight's fp32 main gradient (fusion).
             auto weight_grad = [=] {
               if (autograd::add_weight_grad_into_main_grad(weight_leaf, g3, sx.get("linear"))) return Tensor();
               return ops::contiguous_view(ops::gemm(g3, sx.get("linear"), true, false), {out, in});
             };
             auto bias_grad = [=] {
               return ops::reduce(ops::ReduceOp::Sum, ops::contiguous_view(g3, {rows, out}), {0}, false);
             };
             autograd::WeightGradStore* store = autograd::WeightGradStore::active();
             if (store != nullptr && deferrable) {
               // The same GEMM and reduction, run by the store's flush, accumulated as the engine would
               // (deferrable: every parameter that wants a gradient is a leaf).
               store->defer([=] {
                 if (gw) autograd::accumulate_leaf_grad(weight_leaf, weight_grad());
                 if (gb) autograd::accumulate_leaf_grad(bias_leaf, bias_grad());
               });
               return res;
             }
             if (gw) res[1] = weight_grad();
             if (gb) res[2] = bias_grad();
             return res;
           });
  }
  return y;
}

}  // namespace kiln
