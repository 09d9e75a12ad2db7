// Differentiable batch_norm (training: batch statistics; eval: running statistics), layer_norm
// and rms_norm.
#include "kiln/ops/norm.h"

#include <cmath>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"

namespace kiln {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;
using ops::BinaryOp;

namespace {

// A [C] tensor as [1, C, 1, ...] so it broadcasts over x.
Tensor per_channel(const Tensor& v, const Tensor& x) {
  Shape s(static_cast<std::size_t>(x.dim()), 1);
  s[1] = x.shape()[1];
  return ops::contiguous_view(v, s);
}

std::vector<std::int64_t> non_channel_dims(const Tensor& x) {
  std::vector<std::int64_t> dims{0};
  for (std::int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

// Eval with running statistics and gradients wanted: y = (x - mean) * invstd * w + b, an affine map
// per channel, whose backward needs no batch statistics.
Tensor batch_norm_eval_with_grad(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                 const Tensor& running_var, double momentum, double eps) {
  Tensor y = ops::batch_norm(x, weight, bias, running_mean, running_var, false, momentum, eps).y;
  const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
             gb = bias.defined() && bias.requires_grad();
  Tensor mean = ops::to(running_mean, x.device(), x.dtype()).clone();
  Tensor invstd =
      ops::unary(ops::UnaryOp::Rsqrt, ops::binary(BinaryOp::Add, ops::to(running_var, x.device(), x.dtype()), eps));
  const DType weight_dtype = weight.defined() ? weight.dtype() : x.dtype();
  const DType bias_dtype = bias.defined() ? bias.dtype() : x.dtype();
  record("BatchNormEvalBackward", {x, weight, bias}, {&y},
         [sx = SavedTensor(x.detach()), sw = SavedTensor(weight.defined() ? weight.detach() : Tensor()), mean, invstd,
          gx, gw, gb, weight_dtype, bias_dtype](const Grads& g) -> Grads {
           if (!g[0].defined()) return {Tensor(), Tensor(), Tensor()};
           const Tensor& xv = sx.get("batch_norm");
           Grads out(3);
           Tensor scale = invstd;
           if (sw.defined()) {
             const Tensor& wv = sw.get("batch_norm");
             scale = ops::binary(BinaryOp::Mul, invstd, ops::to(wv, wv.device(), xv.dtype()));
           }
           if (gx) out[0] = ops::binary(BinaryOp::Mul, g[0], per_channel(scale, xv));
           if (gw) {
             Tensor xhat = ops::binary(BinaryOp::Mul, ops::binary(BinaryOp::Sub, xv, per_channel(mean, xv)),
                                       per_channel(invstd, xv));
             out[1] =
                 ops::reduce(ops::ReduceOp::Sum, ops::binary(BinaryOp::Mul, g[0], xhat), non_channel_dims(xv), false);
             if (out[1].dtype() != weight_dtype) out[1] = ops::to(out[1], out[1].device(), weight_dtype);
           }
           if (gb) {
             out[2] = ops::reduce(ops::ReduceOp::Sum, g[0], non_channel_dims(xv), false);
             if (out[2].dtype() != bias_dtype) out[2] = ops::to(out[2], out[2].device(), bias_dtype);
           }
           return out;
         });
  return y;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps) {
  return batch_norm_act(x, weight, bias, running_mean, running_var, training, momentum, eps, Tensor(), false);
}

Tensor batch_norm_act(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                      const Tensor& running_var, bool training, double momentum, double eps, const Tensor& residual,
                      bool relu) {
  const bool batch_stats = training || !running_mean.defined();
  const bool grad = needs_grad({x, weight, bias, residual});
  if (grad && !batch_stats) {
    // The epilogue after the eval map, as the composed ops (they have that backward).
    Tensor y = batch_norm_eval_with_grad(x, weight, bias, running_mean, running_var, momentum, eps);
    if (residual.defined()) y = add(y, residual);
    return relu ? kiln::relu(y) : y;
  }
  auto r = ops::batch_norm(x, weight, bias, running_mean, running_var, batch_stats, momentum, eps,
                           ops::BatchNormEpilogue{residual, relu});
  Tensor y = r.y;
  if (!grad) return y;
  const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
             gb = bias.defined() && bias.requires_grad(), gr = residual.defined() && residual.requires_grad();
  // Weight and bias may be f32 with a bf16/f16 input (mixed precision): their gradients are
  // returned in their own dtype.
  const DType bias_dtype = bias.defined() ? bias.dtype() : x.dtype();
  const bool epilogue = relu || residual.defined();
  const char* op = epilogue ? "batch_norm_act" : "batch_norm";
  // With the ReLU the backward needs the output's sign; y is what the next layer saves anyway.
  record(epilogue ? "BatchNormActBackward" : "BatchNormBackward", {x, weight, bias, residual}, {&y},
         [sx = SavedTensor(x.detach()), sw = SavedTensor(weight.defined() ? weight.detach() : Tensor()),
          sy = relu ? SavedTensor(y.detach()) : SavedTensor(), mean = r.save_mean, invstd = r.save_invstd, gx, gw, gb,
          gr, relu, bias_dtype, op](const Grads& g) -> Grads {
           if (!g[0].defined()) return {Tensor(), Tensor(), Tensor(), Tensor()};
           const Tensor w = sw.defined() ? sw.get(op) : Tensor();
           auto res = ops::batch_norm_epilogue_backward(g[0], sx.get(op), relu ? sy.get(op) : Tensor(), relu, w, mean,
                                                        invstd, gx, gw, gb, gr);
           if (res.b.defined() && res.b.dtype() != bias_dtype) res.b = ops::to(res.b, res.b.device(), bias_dtype);
           return {res.x, res.w, res.b, res.residual};
         });
  return y;
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  auto r = ops::layer_norm(x, weight, bias, eps);
  Tensor y = r.y;
  if (needs_grad({x, weight, bias})) {
    record("LayerNormBackward", {x, weight, bias}, {&y},
           [sx = SavedTensor(x.detach()), sw = SavedTensor(weight.defined() ? weight.detach() : Tensor()),
            mean = r.mean, rstd = r.rstd, gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
            gb = bias.defined() && bias.requires_grad(),
            bias_shape = bias.defined() ? bias.shape() : Shape{}](const Grads& g) -> Grads {
             if (!g[0].defined()) return {Tensor(), Tensor(), Tensor()};
             const Tensor w = sw.defined() ? sw.get("layer_norm") : Tensor();
             auto res = ops::layer_norm_backward(g[0], sx.get("layer_norm"), w, mean, rstd, gx, gw, gb);
             if (res.b.defined() && res.b.shape() != bias_shape)
               res.b = make_view(res.b, bias_shape, contiguous_strides(bias_shape), res.b.storage_offset());
             return {res.x, res.w, res.b};
           });
  }
  return y;
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  auto r = ops::rms_norm(x, weight, eps);
  Tensor y = r.y;
  if (needs_grad({x, weight})) {
    record(
        "RmsNormBackward", {x, weight}, {&y},
        [sx = SavedTensor(x.detach()), sw = SavedTensor(weight.defined() ? weight.detach() : Tensor()), rstd = r.rstd,
         gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad()](const Grads& g) -> Grads {
          if (!g[0].defined()) return {Tensor(), Tensor()};
          const Tensor w = sw.defined() ? sw.get("rms_norm") : Tensor();
          auto res = ops::rms_norm_backward(g[0], sx.get("rms_norm"), w, rstd, gx, gw);
          return {res.x, res.w};
        });
  }
  return y;
}

}  // namespace kiln
