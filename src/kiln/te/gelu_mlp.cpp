#include "kiln/te/gelu_mlp.h"

#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/autograd/record.h"
#include "kiln/autograd/weight_grad_store.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/reduce.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te {

namespace {

constexpr const char* kGeluMlpOp = "linear_gelu_linear";

void check_weight(const Tensor& x, const Tensor& w, std::int64_t in, const char* name) {
  KILN_CHECK(w.defined() && w.dim() == 2 && w.shape()[1] == in && w.dtype() == x.dtype() && w.device() == x.device(),
             "{}: {} must be [out, {}] with x's dtype and device ({}), got {}", kGeluMlpOp, name, in, x.describe(),
             w.defined() ? w.describe() : "undefined");
}

void check_bias(const Tensor& x, const Tensor& b, std::int64_t out, const char* name) {
  if (!b.defined()) return;
  KILN_CHECK(b.dim() == 1 && b.shape()[0] == out && b.dtype() == x.dtype() && b.device() == x.device(),
             "{}: {} must be [{}] with x's dtype and device ({}), got {}", kGeluMlpOp, name, out, x.describe(),
             b.describe());
}

Tensor as_gemm_batch(const Tensor& m) { return m.view({1, m.shape()[0], m.shape()[1]}); }

}  // namespace

Tensor linear_gelu_linear(const Tensor& x_in, const Tensor& w1_in, const Tensor& b1_in, const Tensor& w2_in,
                          const Tensor& b2_in) {
  KILN_CHECK(x_in.defined() && is_floating(x_in.dtype()) && x_in.dim() >= 1,
             "{}: x must be a floating [..., K] tensor, got {}", kGeluMlpOp,
             x_in.defined() ? x_in.describe() : "undefined");
  const std::int64_t k = x_in.shape().back();
  check_weight(x_in, w1_in, k, "w1");
  const std::int64_t f = w1_in.shape()[0];
  check_bias(x_in, b1_in, f, "b1");
  check_weight(x_in, w2_in, f, "w2");
  const std::int64_t h = w2_in.shape()[0];
  check_bias(x_in, b2_in, h, "b2");
  const std::int64_t n = k > 0 ? x_in.numel() / k : 0;
  const Tensor x = ops::contiguous(x_in).reshape({n, k}), w1 = ops::contiguous(w1_in), w2 = ops::contiguous(w2_in);
  const Tensor b1 = b1_in.defined() ? ops::contiguous(b1_in) : Tensor();
  const Device dev = x.device();
  const DType t = x.dtype();
  Tensor act = Tensor::empty({n, f}, t, dev), pre = Tensor::empty({n, f}, t, dev);
  Tensor out = Tensor::empty({n, h}, t, dev);
  if (act.numel() > 0) ops::kernel(fused_ops().linear_bias_gelu_forward, dev, t)(x, w1, b1, act, pre);
  if (out.numel() > 0) ops::gemm_into(as_gemm_batch(act), as_gemm_batch(w2), as_gemm_batch(out), false, true, 1.0, 0.0);
  if (b2_in.defined()) out = ops::binary(ops::BinaryOp::Add, out, b2_in);
  Shape out_shape = x_in.shape();
  out_shape.back() = h;
  out = out.view(out_shape);
  if (autograd::needs_grad({x_in, w1_in, b1_in, w2_in, b2_in})) {
    const bool gx = x_in.requires_grad(), gw1 = w1_in.requires_grad(), gb1 = b1_in.defined() && b1_in.requires_grad(),
               gw2 = w2_in.requires_grad(), gb2 = b2_in.defined() && b2_in.requires_grad();
    // Zero-bubble pipelines (autograd/weight_grad_store.h): the weights' and fc2's bias gradient GEMMs
    // can wait for the W pass when those are leaves; fc1's bias gradient comes out of the data-gradient
    // GEMM's epilogue, so it stays.
    const bool deferrable =
        (gw1 || gw2 || gb2) && (!gw1 || w1_in.is_leaf()) && (!gw2 || w2_in.is_leaf()) && (!gb2 || b2_in.is_leaf());
    autograd::record(
        "LinearGeluLinearBackward", {x_in, w1_in, b1_in, w2_in, b2_in}, {&out},
        [sx = autograd::SavedTensor(x.detach()), sw1 = autograd::SavedTensor(w1.detach()),
         sw2 = autograd::SavedTensor(w2.detach()), act, pre, x_shape = x_in.shape(), gx, gw1, gb1, gw2, gb2, deferrable,
         w1_leaf = gw1 && w1_in.is_leaf() ? w1_in : Tensor(), w2_leaf = gw2 && w2_in.is_leaf() ? w2_in : Tensor(),
         b2_leaf = deferrable && gb2 ? b2_in : Tensor()](const autograd::Grads& g) -> autograd::Grads {
          if (!g[0].defined()) return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
          const Tensor& xv = sx.get(kGeluMlpOp);
          const Tensor& w1v = sw1.get(kGeluMlpOp);
          const Tensor& w2v = sw2.get(kGeluMlpOp);
          const Tensor dout = ops::contiguous(g[0]).reshape({act.shape()[0], w2v.shape()[0]});
          const Device d = xv.device();
          const DType dt = xv.dtype();
          autograd::Grads grads(5);
          // Undefined when the GEMM added it into the leaf's fp32 main gradient (grad_accumulation_fusion.h).
          auto weight_grad = [](const Tensor& dy, const Tensor& input, const Shape& shape, const Tensor& leaf) {
            if (autograd::add_weight_grad_into_main_grad(leaf, as_gemm_batch(dy), as_gemm_batch(input)))
              return Tensor();
            Tensor dw = Tensor::empty(shape, input.dtype(), input.device());
            ops::gemm_into(as_gemm_batch(dy), as_gemm_batch(input), as_gemm_batch(dw), true, false, 1.0, 0.0);
            return dw;
          };
          autograd::WeightGradStore* store = autograd::WeightGradStore::active();
          const bool defer = store != nullptr && deferrable;
          if (!defer) {
            if (gb2) grads[4] = ops::reduce(ops::ReduceOp::Sum, dout, {0}, false);
            if (gw2) grads[3] = weight_grad(dout, act, w2v.shape(), w2_leaf);
          }
          if (!gx && !gw1 && !gb1 && !defer) return grads;
          // fc2's data-gradient GEMM with the GELU backward and fc1's bias gradient as its epilogue.
          Tensor dpre = Tensor::empty(pre.shape(), dt, d);
          Tensor db1 = gb1 ? Tensor::empty({w1v.shape()[0]}, dt, d) : Tensor();
          if (dpre.numel() > 0) {
            ops::kernel(fused_ops().dgelu_bgrad_gemm, d, dt)(dout, w2v, pre, dpre, db1);
          } else if (db1.defined()) {
            db1.zero_();
          }
          grads[2] = db1;
          if (gx) {
            Tensor dx = Tensor::empty(xv.shape(), dt, d);
            ops::gemm_into(as_gemm_batch(dpre), as_gemm_batch(w1v), as_gemm_batch(dx), false, false, 1.0, 0.0);
            grads[0] = dx.view(x_shape);
          }
          if (defer) {
            // The same GEMMs and reduction, run by the store's flush into the leaves' .grad
            // (deferrable: every parameter that wants a gradient here is a leaf).
            store->defer([=, w1_shape = w1v.shape(), w2_shape = w2v.shape()] {
              if (gw2) autograd::accumulate_leaf_grad(w2_leaf, weight_grad(dout, act, w2_shape, w2_leaf));
              if (gb2) autograd::accumulate_leaf_grad(b2_leaf, ops::reduce(ops::ReduceOp::Sum, dout, {0}, false));
              if (gw1) autograd::accumulate_leaf_grad(w1_leaf, weight_grad(dpre, xv, w1_shape, w1_leaf));
            });
            return grads;
          }
          if (gw1) grads[1] = weight_grad(dpre, xv, w1v.shape(), w1_leaf);
          return grads;
        });
  }
  return out;
}

}  // namespace kiln::te
