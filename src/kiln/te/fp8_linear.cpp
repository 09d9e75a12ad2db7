#include "kiln/te/fp8_linear.h"

#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/te/fp8_amax_reduction.h"
#include "kiln/te/fp8_primary_weight.h"
#include "kiln/te/fp8_update_group.h"
#include "kiln/te/fp8_weight_cache.h"

namespace kiln::te {

Fp8ScalingState Fp8ScalingState::fresh(std::int64_t history_len, Device device) {
  KILN_CHECK(history_len >= 1, "Fp8ScalingState: amax history length {} must be at least 1", history_len);
  return {Tensor::zeros({history_len}, DType::F32, device), Tensor::ones({1}, DType::F32, device),
          Tensor::ones({1}, DType::F32, device)};
}

namespace {

bool blockwise(const Fp8Recipe& r) { return r.recipe == Fp8ScalingRecipe::Blockwise; }
bool delayed(const Fp8Recipe& r) { return r.recipe == Fp8ScalingRecipe::Delayed; }

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

// Delayed: the cast multiplies by the state's scale and records its amax into history[0]. The
// scale is aliased, not copied (no launch): the update advances it later, but only the cast reads
// an Fp8Tensor's `scale`; GEMMs and dequantisation read its scale_inv, which the cast wrote.
void bind_delayed(Fp8Tensor& q, const Fp8ScalingState& state) {
  q.scale = state.scale;
  q.amax = state.amax_history.narrow(0, 0, 1);
}

// How a cast scales: the delayed recipe's state (its scale, its history's entry 0 for the amax),
// and the group the tensor is split over (tensorwise: the current scale from the group's amax).
struct CastScaling {
  const Fp8ScalingState* state = nullptr;
  const dist::Communicator* amax_group = nullptr;
};

// Tensorwise over a group: the cast multiplies by the whole tensor's current scale, computed first
// (a delayed-style cast with a given scale makes the bytes current scaling would).
ops::Fp8CastOptions scale_for_cast(const Tensor& x, DType dtype, const Fp8Recipe& r, const CastScaling& s,
                                   std::initializer_list<Fp8Tensor*> outputs) {
  ops::Fp8CastOptions o = cast_options(r);
  if (delayed(r)) {
    bind_delayed(*outputs.begin()[0], *s.state);
    for (Fp8Tensor* q : outputs) q->scale = s.state->scale;
  } else if (o.current_scaling && s.amax_group != nullptr) {
    const Tensor scale = group_current_scale(x, dtype, *s.amax_group);
    for (Fp8Tensor* q : outputs) q->scale = scale;
    o.current_scaling = false;
  }
  return o;
}

// The rowwise cast only (no backward will need the transpose).
Fp8Tensor cast_rowwise(const Tensor& x, DType dtype, ScalingLayout layout, const Fp8Recipe& r, const CastScaling& s) {
  Fp8Tensor q = ops::fp8_alloc(x.shape()[0], x.shape()[1], dtype, layout, x.device());
  ops::fp8_quantize_into(x, q, scale_for_cast(x, dtype, r, s, {&q}));
  return q;
}

// Both orientations in one pass: rowwise [R, C] and the columnwise cast of x^T [C, R]; with the
// delayed recipe both use the state's scale (the amax is that of x either way).
Fp8Casts cast_both(const Tensor& x, DType dtype, ScalingLayout layout, const Fp8Recipe& r, const CastScaling& s) {
  const std::int64_t R = x.shape()[0], C = x.shape()[1];
  Fp8Casts c{ops::fp8_alloc(R, C, dtype, layout, x.device()), ops::fp8_alloc(C, R, dtype, layout, x.device())};
  const ops::Fp8CastOptions o = scale_for_cast(x, dtype, r, s, {&c.rowwise, &c.columnwise});
  ops::fp8_quantize_transpose_into(x, c.rowwise, c.columnwise, o);
  return c;
}

// The delayed updates of the states whose casts just recorded an amax: queued on the state's
// group (which reduces the amaxes when it flushes), or reduced over `amax_group` and run now in one
// launch.
void update(const Fp8Recipe& r, const std::shared_ptr<Fp8UpdateGroup>& group, const dist::Communicator* amax_group,
            const std::vector<std::pair<const Fp8ScalingState*, DType>>& cast) {
  if (!delayed(r) || cast.empty()) return;
  if (group) {
    for (const auto& [s, dtype] : cast) group->queue(*s, ops::fp8_scaled_max(dtype, r.margin));
    return;
  }
  std::vector<ops::Fp8DelayedScalingRef> refs;
  for (const auto& [s, dtype] : cast)
    refs.push_back({s->amax_history, s->scale, s->scale_inv, ops::fp8_scaled_max(dtype, r.margin)});
  if (amax_group) reduce_recorded_amaxes(refs, *amax_group);
  ops::fp8_delayed_scaling_update_many(refs, r.amax_compute_algo);
}

DType gemm_out_dtype(DType t) { return t == DType::F32 ? DType::F32 : DType::BF16; }

// out = a b^T with a [M, K] and b [N, K]: the native form, no transposes.
Tensor gemm_nt(const Fp8Tensor& a, const Fp8Tensor& b, DType out) {
  ops::Fp8GemmOptions o;
  o.trans_a = false;
  o.trans_b = true;
  o.out_dtype = out;
  return ops::fp8_gemm(a, b, o);
}

}  // namespace

Fp8Tensor fp8_linear_input_cast(const Fp8LinearState& state, const Fp8Recipe& recipe, std::int64_t rows,
                                std::int64_t in, Device device) {
  KILN_CHECK(delayed(recipe), "fp8_linear_input_cast: a producer-made input cast needs the delayed recipe, not {}",
             to_string(recipe.recipe));
  Fp8Tensor q = ops::fp8_alloc(rows, in, recipe.forward_dtype(), ScalingLayout::PerTensor, device);
  bind_delayed(q, state.input);
  return q;
}

namespace {

Tensor fp8_linear_impl(const Tensor& x, const Tensor& weight, const Tensor& bias, const Fp8Recipe& recipe,
                       const Fp8LinearState* state, const Fp8Tensor* x_cast) {
  KILN_CHECK(
      x.defined() && weight.defined() && weight.dim() == 2 && x.dim() >= 1 && x.shape().back() == weight.shape()[1],
      "fp8_linear: x {} and weight {} do not fit (weight must be [out, in], x [..., in])",
      x.defined() ? x.describe() : "undefined", weight.defined() ? weight.describe() : "undefined");
  KILN_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16,
             "fp8_linear: x has dtype {}, expected float32 or bfloat16", dtype_name(x.dtype()));
  const Fp8PrimaryWeight* primary = state ? state->primary_weight.get() : nullptr;
  KILN_CHECK(!primary || primary->cast.data.is_same(weight),
             "fp8_linear: the layer keeps its weight in FP8 (--fp8-param-gather) but was given another weight {}",
             weight.describe());
  KILN_CHECK(primary || weight.dtype() == x.dtype(), "fp8_linear: weight is {} but x is {}", dtype_name(weight.dtype()),
             dtype_name(x.dtype()));
  KILN_CHECK(recipe.recipe != Fp8ScalingRecipe::Mxfp8, "fp8_linear: {}",
             fp8_recipe_unsupported_reason(recipe, x.device()));
  KILN_CHECK(!delayed(recipe) || state != nullptr, "fp8_linear: the delayed recipe needs the layer's scaling state");
  const std::int64_t in = weight.shape()[1], out = weight.shape()[0];
  const std::int64_t rows = in == 0 ? 0 : x.numel() / in;
  KILN_CHECK(in % 16 == 0 && out % 16 == 0 && rows % 16 == 0,
             "fp8_linear: FP8 GEMMs need every dimension a multiple of 16; got {} tokens x {} in -> {} out (pick a "
             "hidden size, FFN size, head layout and --micro-batch-size x --seq-length that are multiples of 16)",
             rows, in, out);

  if (x_cast) {
    KILN_CHECK(delayed(recipe) && x_cast->layout == ScalingLayout::PerTensor && x_cast->rows() == rows &&
                   x_cast->cols() == in && x_cast->dtype() == recipe.forward_dtype() && x_cast->device() == x.device(),
               "fp8_linear: x_cast must be the delayed recipe's per-tensor {} [{}, {}] cast on {} (got {} {} {})",
               dtype_name(recipe.forward_dtype()), rows, in, x.device().str(), to_string(recipe.recipe),
               dtype_name(x_cast->dtype()), shape_str(x_cast->data.shape()));
    KILN_CHECK(x_cast->amax.storage() == state->input.amax_history.storage(),
               "fp8_linear: x_cast must record its amax into the layer's input history (use fp8_linear_input_cast)");
  }
  // A producer-cast x is not read (its high-precision values were never written).
  const Tensor x2 = x_cast ? Tensor() : ops::contiguous(x.detach().reshape({rows, in}));
  const Tensor w = ops::contiguous(weight.detach());
  const DType out_dtype = gemm_out_dtype(x.dtype()), fwd = recipe.forward_dtype();
  const bool wants_grad = autograd::needs_grad({x, weight});
  // Only training calls use the cache: a no-grad call (an evaluation between steps) casts W afresh
  // and leaves the cache alone, so the next training call casts W as it would have without the
  // evaluation, and a run resumed from a checkpoint casts the same bytes as the straight run.
  const std::shared_ptr<Fp8WeightCache> cache = state && wants_grad ? state->weight_cache : nullptr;
  const std::shared_ptr<Fp8UpdateGroup> group = state ? state->updates : nullptr;
  std::vector<std::pair<const Fp8ScalingState*, DType>> cast;  // states whose amax the casts recorded
  const dist::Communicator* amax_group = state && state->amax_group ? &*state->amax_group : nullptr;
  const CastScaling weight_scaling{state ? &state->weight : nullptr, amax_group};
  const CastScaling input_scaling{state ? &state->input : nullptr, amax_group};

  // W: both orientations (fprop's and dgrad's), reused while W is unchanged. An FP8 primary weight
  // is its own rowwise cast; its columnwise one is an fp8 transpose of its bytes (recorded nowhere:
  // the weight's scaling is the optimizer's master cast's).
  const Fp8Casts* cached = cache ? cache->find(w, fwd, weight_layout(recipe)) : nullptr;
  Fp8Casts qw;
  if (primary) {
    qw.rowwise = primary->cast;
    qw.rowwise.data = w;
    if (cached) {
      qw.columnwise = cached->columnwise;
    } else if (wants_grad) {
      qw.columnwise = fp8_transposed(qw.rowwise);
      if (cache) cache->store(w, fwd, weight_layout(recipe), qw);
    }
  } else if (cached) {
    qw = *cached;
  } else if (cache || wants_grad) {
    qw = cast_both(w, fwd, weight_layout(recipe), recipe, weight_scaling);
    if (cache) cache->store(w, fwd, weight_layout(recipe), qw);
    cast.emplace_back(state ? &state->weight : nullptr, fwd);
  } else {
    qw.rowwise = cast_rowwise(w, fwd, weight_layout(recipe), recipe, weight_scaling);
    cast.emplace_back(state ? &state->weight : nullptr, fwd);
  }
  // x: the columnwise cast (x^T, wgrad's operand) only when a backward will run.
  Fp8Casts qx;
  if (x_cast) {
    qx.rowwise = *x_cast;
    if (wants_grad) {
      qx.columnwise = *x_cast;
      qx.columnwise.data = ops::contiguous(x_cast->data.t());  // a cast is elementwise: its transpose is x^T's cast
    }
  } else if (wants_grad)
    qx = cast_both(x2, fwd, activation_layout(recipe), recipe, input_scaling);
  else
    qx.rowwise = cast_rowwise(x2, fwd, activation_layout(recipe), recipe, input_scaling);
  cast.emplace_back(state ? &state->input : nullptr, fwd);
  update(recipe, group, amax_group, cast);

  Tensor y = gemm_nt(qx.rowwise, qw.rowwise, out_dtype);
  if (wants_grad) {
    const std::optional<Fp8ScalingState> grad_state =
        state ? std::optional(state->grad_output) : std::optional<Fp8ScalingState>();
    autograd::record(
        "Fp8LinearBackward", {x, weight}, {&y},
        [xcol = qx.columnwise, wcol = qw.columnwise, recipe, grad_state, group,
         grad_group = state ? state->amax_group : std::nullopt, x_shape = x.shape(), xt = x.dtype(),
         wt = weight.dtype(), weight_leaf = weight.requires_grad() && weight.is_leaf() ? weight : Tensor()](
            const autograd::Grads& g) -> autograd::Grads {
          if (!g[0].defined()) return {Tensor(), Tensor()};
          const Tensor g2 = ops::contiguous(g[0].reshape({-1, g[0].shape().back()}));
          const Fp8ScalingState* gs = grad_state ? &*grad_state : nullptr;
          const DType bwd = recipe.gradient_dtype();
          const dist::Communicator* gg = grad_group ? &*grad_group : nullptr;
          const Fp8Casts qg = cast_both(g2, bwd, activation_layout(recipe), recipe, {gs, gg});
          update(recipe, group, gg, {{gs, bwd}});
          const Tensor dx = gemm_nt(qg.rowwise, wcol, gemm_out_dtype(xt));  // dy [T, out] . W^T [in, out]
          // dy^T [out, T] . x^T [in, T]. Gradient-accumulation fusion (TE's
          // fuse_wgrad_accumulation): the GEMM adds it into the weight's fp32 main gradient
          // (autograd/grad_accumulation_fusion.h), saving a 16-bit product and the pass that
          // adds it; nothing then flows to the weight.
          if (const Tensor main_grad = autograd::fusable_main_grad(weight_leaf); main_grad.defined()) {
            ops::Fp8GemmOptions o;
            o.accumulate = true;
            ops::fp8_gemm_into(qg.columnwise, xcol, main_grad, o);
            autograd::note_main_grad_accumulated(weight_leaf);
            return {dx.to(xt).reshape(x_shape), Tensor()};
          }
          // An fp8 weight's gradient is in x's dtype (it accumulates into the f32 buffer).
          const DType wg = is_fp8(wt) ? xt : wt;
          const Tensor dw = gemm_nt(qg.columnwise, xcol, gemm_out_dtype(wg));
          return {dx.to(xt).reshape(x_shape), dw.to(wg)};
        });
  }
  Shape y_shape = x.shape();
  y_shape.back() = out;
  y = y.reshape(y_shape);
  if (bias.defined()) y = add(y, bias);
  return y;
}

}  // namespace

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Fp8Recipe& recipe,
                  const Fp8LinearState* state) {
  return fp8_linear_impl(x, weight, bias, recipe, state, nullptr);
}

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Fp8Recipe& recipe,
                  const Fp8LinearState* state, const Fp8Tensor& x_cast) {
  return fp8_linear_impl(x, weight, bias, recipe, state, &x_cast);
}

}  // namespace kiln::te
