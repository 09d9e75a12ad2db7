#include "kiln/te/fp8_linear.h"

#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"

namespace kiln::te {

Fp8ScalingState Fp8ScalingState::fresh(std::int64_t history_len, Device device) {
  KILN_CHECK(history_len >= 1, "Fp8ScalingState: amax history length {} must be at least 1", history_len);
  return {Tensor::zeros({history_len}, DType::F32, device), Tensor::ones({1}, DType::F32, device),
          Tensor::ones({1}, DType::F32, device)};
}

namespace {

bool blockwise(const Fp8Recipe& r) { return r.recipe == Fp8ScalingRecipe::Blockwise; }

ScalingLayout activation_layout(const Fp8Recipe& r) {
  return blockwise(r) ? ScalingLayout::Block1x128 : ScalingLayout::PerTensor;
}
ScalingLayout weight_layout(const Fp8Recipe& r) {
  return blockwise(r) ? ScalingLayout::Block128x128 : ScalingLayout::PerTensor;
}

ops::Fp8CastOptions cast_options(const Fp8Recipe& r) {
  ops::Fp8CastOptions o;
  o.current_scaling = r.recipe == Fp8ScalingRecipe::Tensorwise;
  o.power_of_two_scales = blockwise(r);  // TE's Float8BlockScaling default (and DeepSeek-V3's)
  return o;
}

// A 2-D tensor cast for the recipe. Per tensor, one cast serves every GEMM (the GEMM transposes fp8
// bytes where it needs the other orientation). Delayed: the cast multiplies by the state's scale
// (copied, so this Fp8Tensor keeps the scale it was cast with), records its amax into the history's
// entry 0, and the update turns the history into the next scale.
Fp8Tensor cast_per_tensor(const Tensor& x, DType dtype, const Fp8Recipe& r, const Fp8ScalingState* state) {
  Fp8Tensor q = ops::fp8_empty(x.shape()[0], x.shape()[1], dtype, ScalingLayout::PerTensor, x.device());
  if (r.recipe != Fp8ScalingRecipe::Delayed) {
    ops::fp8_quantize_into(x, q, cast_options(r));
    return q;
  }
  q.scale = state->scale.clone();
  q.amax = state->amax_history.narrow(0, 0, 1);
  ops::fp8_quantize_into(x, q, cast_options(r));
  ops::fp8_delayed_scaling_update(state->amax_history, state->scale, state->scale_inv, r.amax_compute_algo,
                                  ops::fp8_scaled_max(dtype, r.margin));
  return q;
}

// Both orientations of a block-scaled cast: [R, C] with blocks along C and [C, R] with blocks along R.
struct BlockCasts {
  Fp8Tensor rowwise, columnwise;
};
BlockCasts cast_blocks(const Tensor& x, DType dtype, ScalingLayout layout, const Fp8Recipe& r) {
  const std::int64_t R = x.shape()[0], C = x.shape()[1];
  BlockCasts c{ops::fp8_empty(R, C, dtype, layout, x.device()), ops::fp8_empty(C, R, dtype, layout, x.device())};
  ops::fp8_quantize_transpose_into(x, c.rowwise, c.columnwise, cast_options(r));
  return c;
}

DType gemm_out_dtype(DType t) { return t == DType::F32 ? DType::F32 : DType::BF16; }

Tensor gemm(const Fp8Tensor& a, const Fp8Tensor& b, bool trans_a, bool trans_b, DType out) {
  ops::Fp8GemmOptions o;
  o.trans_a = trans_a;
  o.trans_b = trans_b;
  o.out_dtype = out;
  return ops::fp8_gemm(a, b, o);
}

}  // namespace

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Fp8Recipe& recipe,
                  const Fp8LinearState* state) {
  KILN_CHECK(
      x.defined() && weight.defined() && weight.dim() == 2 && x.dim() >= 1 && x.shape().back() == weight.shape()[1],
      "fp8_linear: x {} and weight {} do not fit (weight must be [out, in], x [..., in])",
      x.defined() ? x.describe() : "undefined", weight.defined() ? weight.describe() : "undefined");
  KILN_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16,
             "fp8_linear: x has dtype {}, expected float32 or bfloat16", dtype_name(x.dtype()));
  KILN_CHECK(weight.dtype() == x.dtype(), "fp8_linear: weight is {} but x is {}", dtype_name(weight.dtype()),
             dtype_name(x.dtype()));
  KILN_CHECK(recipe.recipe != Fp8ScalingRecipe::Mxfp8, "fp8_linear: {}",
             fp8_recipe_unsupported_reason(recipe, x.device()));
  KILN_CHECK(recipe.recipe != Fp8ScalingRecipe::Delayed || state != nullptr,
             "fp8_linear: the delayed recipe needs the layer's scaling state");
  const std::int64_t in = weight.shape()[1], out = weight.shape()[0];
  const std::int64_t rows = in == 0 ? 0 : x.numel() / in;
  KILN_CHECK(in % 16 == 0 && out % 16 == 0 && rows % 16 == 0,
             "fp8_linear: FP8 GEMMs need every dimension a multiple of 16; got {} tokens x {} in -> {} out (pick a "
             "hidden size, FFN size, head layout and --micro-batch-size x --seq-length that are multiples of 16)",
             rows, in, out);

  const Tensor x2 = ops::contiguous(x.detach().reshape({rows, in}));
  const Tensor w = ops::contiguous(weight.detach());
  const DType out_dtype = gemm_out_dtype(x.dtype());
  const bool wants_grad = autograd::needs_grad({x, weight});
  Tensor y;
  if (blockwise(recipe)) {
    // The backward needs x^T (wgrad) and W^T (dgrad) with blocks along their other axis.
    const BlockCasts qx = cast_blocks(x2, recipe.forward_dtype(), activation_layout(recipe), recipe);
    const BlockCasts qw = cast_blocks(w, recipe.forward_dtype(), weight_layout(recipe), recipe);
    y = gemm(qx.rowwise, qw.rowwise, false, true, out_dtype);
    if (wants_grad)
      autograd::record(
          "Fp8LinearBackward", {x, weight}, {&y},
          [xcol = qx.columnwise, wcol = qw.columnwise, recipe, x_shape = x.shape(), xt = x.dtype(),
           wt = weight.dtype()](const autograd::Grads& g) -> autograd::Grads {
            if (!g[0].defined()) return {Tensor(), Tensor()};
            const Tensor g2 = ops::contiguous(g[0].reshape({-1, g[0].shape().back()}));
            const BlockCasts qg = cast_blocks(g2, recipe.gradient_dtype(), activation_layout(recipe), recipe);
            const Tensor dx = gemm(qg.rowwise, wcol, false, true, gemm_out_dtype(xt));  // dy [T, out] x W^T [in, out]
            const Tensor dw =
                gemm(qg.columnwise, xcol, false, true, gemm_out_dtype(wt));  // dy^T [out, T] x x^T [in, T]
            return {dx.to(xt).reshape(x_shape), dw.to(wt)};
          });
  } else {
    const Fp8Tensor qx = cast_per_tensor(x2, recipe.forward_dtype(), recipe, state ? &state->input : nullptr);
    const Fp8Tensor qw = cast_per_tensor(w, recipe.forward_dtype(), recipe, state ? &state->weight : nullptr);
    y = gemm(qx, qw, false, true, out_dtype);
    if (wants_grad) {
      const Fp8ScalingState* grad_state = state ? &state->grad_output : nullptr;
      autograd::record(
          "Fp8LinearBackward", {x, weight}, {&y},
          [qx, qw, recipe, grad_state = grad_state ? std::optional(*grad_state) : std::nullopt, x_shape = x.shape(),
           xt = x.dtype(), wt = weight.dtype()](const autograd::Grads& g) -> autograd::Grads {
            if (!g[0].defined()) return {Tensor(), Tensor()};
            const Tensor g2 = ops::contiguous(g[0].reshape({-1, g[0].shape().back()}));
            const Fp8Tensor qg =
                cast_per_tensor(g2, recipe.gradient_dtype(), recipe, grad_state ? &*grad_state : nullptr);
            const Tensor dx = gemm(qg, qw, false, false, gemm_out_dtype(xt));  // dy [T, out] W [out, in]
            const Tensor dw = gemm(qg, qx, true, false, gemm_out_dtype(wt));   // dy^T [out, T] x [T, in]
            return {dx.to(xt).reshape(x_shape), dw.to(wt)};
          });
    }
  }
  Shape y_shape = x.shape();
  y_shape.back() = out;
  y = y.reshape(y_shape);
  if (bias.defined()) y = add(y, bias);
  return y;
}

}  // namespace kiln::te
