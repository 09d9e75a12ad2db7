#include "kiln/te/fp8_grouped_linear.h"

#include <optional>
#include <vector>

#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/runtime/graph_capture_state.h"
#include "kiln/te/moe_ops.h"

namespace kiln::te {

namespace {

// The casts below follow te/fp8_linear.cpp's (same options, same delayed-scaling order: cast with the
// state's scale, record the amax into history[0], update), kept here so that file's internals can
// change independently.
bool grouped_blockwise(const Fp8Recipe& r) { return r.recipe == Fp8ScalingRecipe::Blockwise; }

ops::Fp8CastOptions grouped_cast_options(const Fp8Recipe& r) {
  ops::Fp8CastOptions o;
  o.current_scaling = r.recipe == Fp8ScalingRecipe::Tensorwise;
  o.power_of_two_scales = grouped_blockwise(r);
  return o;
}

Fp8Tensor cast_per_tensor(const Tensor& x, DType dtype, const Fp8Recipe& r, const Fp8ScalingState* state) {
  Fp8Tensor q = ops::fp8_empty(x.shape()[0], x.shape()[1], dtype, ScalingLayout::PerTensor, x.device());
  if (r.recipe != Fp8ScalingRecipe::Delayed) {
    ops::fp8_quantize_into(x, q, grouped_cast_options(r));
    return q;
  }
  q.scale = state->scale.clone();
  q.amax = state->amax_history.narrow(0, 0, 1);
  ops::fp8_quantize_into(x, q, grouped_cast_options(r));
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
  ops::fp8_quantize_transpose_into(x, c.rowwise, c.columnwise, grouped_cast_options(r));
  return c;
}

// Rows lo .. lo + n of a per-tensor cast (the scale is the whole tensor's).
Fp8Tensor rows_of(const Fp8Tensor& q, std::int64_t lo, std::int64_t n) {
  Fp8Tensor r = q;
  r.data = q.data.narrow(0, lo, n);
  return r;
}

// accumulate: out (float32) += the product (a weight gradient into its fp32 main gradient).
void gemm_into(const Fp8Tensor& a, const Fp8Tensor& b, bool trans_a, bool trans_b, const Tensor& out,
               bool accumulate = false) {
  ops::Fp8GemmOptions o;
  o.trans_a = trans_a;
  o.trans_b = trans_b;
  o.accumulate = accumulate;
  ops::fp8_gemm_into(a, b, out, o);
}

// Where the experts' weight gradients go: the fp32 main gradient of the weight leaf when
// gradient-accumulation fusion allows it (autograd/grad_accumulation_fusion.h: each expert's wgrad
// GEMM adds into its [out, in] slice, experts without rows add nothing, and nothing flows to the
// weight), else a fresh [E, out, in] tensor in the weight's dtype (experts without rows get zeros).
struct ExpertWeightGrads {
  Tensor main_grad, dw;
  ExpertWeightGrads(const Tensor& leaf, bool w_grad, std::int64_t experts, std::int64_t out, std::int64_t in, DType wt,
                    Device device)
      : main_grad(w_grad ? autograd::fusable_main_grad(leaf) : Tensor()) {
    if (w_grad && !main_grad.defined()) dw = Tensor::empty({experts, out, in}, wt, device);
  }
  bool fused() const { return main_grad.defined(); }
  Tensor target(std::int64_t e) const { return fused() ? main_grad.select(0, e) : dw.select(0, e); }
  void no_rows(std::int64_t e) const {
    if (dw.defined()) dw.select(0, e).zero_();
  }
  Tensor finish(const Tensor& leaf) const {
    if (fused()) autograd::note_main_grad_accumulated(leaf);
    return dw;
  }
};

constexpr std::int64_t kRowAlign = 16;  // FP8 GEMMs' rule for the contracted dimension (wgrad: the tokens)

// Where each expert's rows go in the padded buffer (TE's Fp8Padding): expert e's rows start at
// padded[e] and its block holds round_up(n_e, 16) rows. The two gathers that move rows between the
// buffers, as index vectors for te's permute kernel (out[i] = in[src[i]], zeros where src is -1):
// to_padded [R_pad] (the row of x each padded row holds, -1 for padding) and from_padded [R] (the
// padded row each row of x went to, -1 for rows past offsets[E]).
struct PaddedRows {
  std::vector<std::int64_t> offsets, padded;  // host, [E + 1] each
  Tensor to_padded, from_padded;              // int64 on the device
  std::int64_t rows(std::int64_t e) const { return offsets[e + 1] - offsets[e]; }
  std::int64_t padded_rows(std::int64_t e) const { return padded[e + 1] - padded[e]; }
};

PaddedRows pad_rows(const Tensor& offsets, std::int64_t experts, std::int64_t rows, Device device) {
  PaddedRows p;
  p.offsets = offsets.to(Device::cpu()).to_vector<std::int64_t>();  // the one read-back (see the header)
  KILN_CHECK(
      static_cast<std::int64_t>(p.offsets.size()) == experts + 1 && p.offsets[0] == 0 && p.offsets.back() <= rows,
      "fp8_grouped_linear: offsets do not fit {} experts over {} rows", experts, rows);
  p.padded.assign(static_cast<std::size_t>(experts) + 1, 0);
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t n = p.offsets[e + 1] - p.offsets[e];
    KILN_CHECK(n >= 0, "fp8_grouped_linear: offsets decrease at expert {}", e);
    p.padded[e + 1] = p.padded[e] + (n + kRowAlign - 1) / kRowAlign * kRowAlign;
  }
  std::vector<std::int64_t> to_padded(static_cast<std::size_t>(p.padded.back()), -1);
  std::vector<std::int64_t> from_padded(static_cast<std::size_t>(rows), -1);
  for (std::int64_t e = 0; e < experts; ++e)
    for (std::int64_t i = 0; i < p.rows(e); ++i) {
      to_padded[static_cast<std::size_t>(p.padded[e] + i)] = p.offsets[e] + i;
      from_padded[static_cast<std::size_t>(p.offsets[e] + i)] = p.padded[e] + i;
    }
  p.to_padded = Tensor::from_vector(to_padded, {p.padded.back()}).to(device);
  p.from_padded = Tensor::from_vector(from_padded, {rows}).to(device);
  return p;
}

// out[i] = x[src[i]] (zeros where src[i] is -1): x [*, C] contiguous -> [src.numel(), C].
Tensor gather_rows(const Tensor& x, const Tensor& src) {
  Tensor out = Tensor::empty({src.numel(), x.size(1)}, x.dtype(), x.device());
  if (out.numel() > 0) ops::kernel(moe_ops().permute, x.device(), x.dtype())(x, src, out);
  return out;
}

}  // namespace

Tensor fp8_grouped_linear(const Tensor& x_in, const Tensor& w_in, const Tensor& offsets, const Fp8Recipe& recipe,
                          const Fp8GroupedLinearState* state) {
  KILN_CHECK(x_in.defined() && x_in.dim() == 2 && w_in.defined() && w_in.dim() == 3 && w_in.size(2) == x_in.size(1),
             "fp8_grouped_linear: x {} and weight {} do not fit (weight must be [E, out, in], x [rows, in])",
             x_in.defined() ? x_in.describe() : "undefined", w_in.defined() ? w_in.describe() : "undefined");
  KILN_CHECK(x_in.dtype() == DType::F32 || x_in.dtype() == DType::BF16,
             "fp8_grouped_linear: x has dtype {}, expected float32 or bfloat16", dtype_name(x_in.dtype()));
  KILN_CHECK(w_in.dtype() == x_in.dtype() && w_in.device() == x_in.device(),
             "fp8_grouped_linear: weight is {} but x is {}", w_in.describe(), x_in.describe());
  const std::int64_t experts = w_in.size(0), out = w_in.size(1), in = w_in.size(2), rows = x_in.size(0);
  KILN_CHECK(offsets.defined() && offsets.dtype() == DType::I64 && offsets.numel() == experts + 1 &&
                 offsets.device() == x_in.device(),
             "fp8_grouped_linear: offsets must be int64 [{}] on {}, got {}", experts + 1, x_in.device().str(),
             offsets.defined() ? offsets.describe() : "undefined");
  KILN_CHECK(recipe.recipe != Fp8ScalingRecipe::Mxfp8, "fp8_grouped_linear: {}",
             fp8_recipe_unsupported_reason(recipe, x_in.device()));
  KILN_CHECK(recipe.recipe != Fp8ScalingRecipe::Delayed ||
                 (state != nullptr && static_cast<std::int64_t>(state->weight.size()) == experts),
             "fp8_grouped_linear: the delayed recipe needs the layer's scaling state with one weight state per "
             "expert ({})",
             experts);
  KILN_CHECK(in % 16 == 0 && out % 16 == 0,
             "fp8_grouped_linear: FP8 GEMMs need the experts' in and out sizes multiples of 16; got {} -> {} (pick "
             "--hidden-size and --moe-ffn-hidden-size multiples of 16)",
             in, out);
  KILN_CHECK(!graph_capture_active(),
             "fp8_grouped_linear: the experts' FP8 GEMMs read the token counts back to the host, which a CUDA graph "
             "capture cannot contain");

  const Device device = x_in.device();
  const DType xt = x_in.dtype(), wt = w_in.dtype();
  const PaddedRows pad = pad_rows(offsets, experts, rows, device);
  const Tensor w = ops::contiguous(w_in.detach());
  const Tensor x_pad = gather_rows(ops::contiguous(x_in.detach()), pad.to_padded);
  Tensor y_pad = Tensor::empty({pad.padded.back(), out}, xt, device);
  const bool wants_grad = autograd::needs_grad({x_in, w_in});
  const bool x_grad = x_in.requires_grad(), w_grad = w_in.requires_grad();
  const Tensor w_leaf = w_grad && w_in.is_leaf() ? w_in : Tensor();  // for gradient-accumulation fusion
  Tensor y;
  if (grouped_blockwise(recipe)) {
    std::vector<BlockCasts> qx(static_cast<std::size_t>(experts)), qw(static_cast<std::size_t>(experts));
    for (std::int64_t e = 0; e < experts; ++e) {
      const auto i = static_cast<std::size_t>(e);
      qw[i] = cast_blocks(w.select(0, e), recipe.forward_dtype(), ScalingLayout::Block128x128, recipe);
      if (pad.padded_rows(e) == 0) continue;
      qx[i] = cast_blocks(x_pad.narrow(0, pad.padded[e], pad.padded_rows(e)), recipe.forward_dtype(),
                          ScalingLayout::Block1x128, recipe);
      gemm_into(qx[i].rowwise, qw[i].rowwise, false, true, y_pad.narrow(0, pad.padded[e], pad.padded_rows(e)));
    }
    y = gather_rows(y_pad, pad.from_padded);
    if (wants_grad)
      autograd::record("Fp8GroupedLinearBackward", {x_in, w_in}, {&y},
                       [qx = std::move(qx), qw = std::move(qw), pad, recipe, xt, wt, in, out, x_grad, w_grad,
                        w_leaf](const autograd::Grads& g) -> autograd::Grads {
                         if (!g[0].defined()) return {Tensor(), Tensor()};
                         const Tensor g_pad = gather_rows(ops::contiguous(g[0]), pad.to_padded);
                         const std::int64_t experts = static_cast<std::int64_t>(qw.size());
                         Tensor dx_pad = Tensor::empty({pad.padded.back(), in}, xt, g_pad.device());
                         const ExpertWeightGrads dw(w_leaf, w_grad, experts, out, in, wt, g_pad.device());
                         for (std::int64_t e = 0; e < experts; ++e) {
                           const auto i = static_cast<std::size_t>(e);
                           if (pad.padded_rows(e) == 0) {
                             dw.no_rows(e);
                             continue;
                           }
                           const BlockCasts qg =
                               cast_blocks(g_pad.narrow(0, pad.padded[e], pad.padded_rows(e)), recipe.gradient_dtype(),
                                           ScalingLayout::Block1x128, recipe);
                           // dgrad: dy_e [n, out] x (W_e^T [in, out])^T; wgrad: dy_e^T [out, n] x (x_e^T [in, n])^T.
                           if (x_grad)
                             gemm_into(qg.rowwise, qw[i].columnwise, false, true,
                                       dx_pad.narrow(0, pad.padded[e], pad.padded_rows(e)));
                           if (w_grad)
                             gemm_into(qg.columnwise, qx[i].columnwise, false, true, dw.target(e), dw.fused());
                         }
                         return {x_grad ? gather_rows(dx_pad, pad.from_padded) : Tensor(), dw.finish(w_leaf)};
                       });
  } else {
    const Fp8Tensor qx = cast_per_tensor(x_pad, recipe.forward_dtype(), recipe, state ? &state->input : nullptr);
    std::vector<Fp8Tensor> qw(static_cast<std::size_t>(experts));
    for (std::int64_t e = 0; e < experts; ++e) {
      const auto i = static_cast<std::size_t>(e);
      qw[i] = cast_per_tensor(w.select(0, e), recipe.forward_dtype(), recipe,
                              state && i < state->weight.size() ? &state->weight[i] : nullptr);  // delayed only
      if (pad.padded_rows(e) > 0)
        gemm_into(rows_of(qx, pad.padded[e], pad.padded_rows(e)), qw[i], false, true,
                  y_pad.narrow(0, pad.padded[e], pad.padded_rows(e)));
    }
    y = gather_rows(y_pad, pad.from_padded);
    if (wants_grad) {
      const Fp8ScalingState* grad_state = state ? &state->grad_output : nullptr;
      autograd::record(
          "Fp8GroupedLinearBackward", {x_in, w_in}, {&y},
          [qx, qw = std::move(qw), pad, recipe, grad_state = grad_state ? std::optional(*grad_state) : std::nullopt, xt,
           wt, in, out, x_grad, w_grad, w_leaf](const autograd::Grads& g) -> autograd::Grads {
            if (!g[0].defined()) return {Tensor(), Tensor()};
            const Tensor g_pad = gather_rows(ops::contiguous(g[0]), pad.to_padded);
            const Fp8Tensor qg =
                cast_per_tensor(g_pad, recipe.gradient_dtype(), recipe, grad_state ? &*grad_state : nullptr);
            const std::int64_t experts = static_cast<std::int64_t>(qw.size());
            Tensor dx_pad = Tensor::empty({pad.padded.back(), in}, xt, g_pad.device());
            const ExpertWeightGrads dw(w_leaf, w_grad, experts, out, in, wt, g_pad.device());
            for (std::int64_t e = 0; e < experts; ++e) {
              const auto i = static_cast<std::size_t>(e);
              const std::int64_t lo = pad.padded[e], n = pad.padded_rows(e);
              if (n == 0) {
                dw.no_rows(e);
                continue;
              }
              const Fp8Tensor qg_e = rows_of(qg, lo, n);
              if (x_grad) gemm_into(qg_e, qw[i], false, false, dx_pad.narrow(0, lo, n));  // dy_e [n, out] W_e
              if (w_grad)                                                                 // dy_e^T x_e
                gemm_into(qg_e, rows_of(qx, lo, n), true, false, dw.target(e), dw.fused());
            }
            return {x_grad ? gather_rows(dx_pad, pad.from_padded) : Tensor(), dw.finish(w_leaf)};
          });
    }
  }
  return y;
}

}  // namespace kiln::te
