#pragma once
// The routed experts of a MoE layer, stacked (Megatron-core's GroupedMLP, "experts"): every expert
// is an MLP without biases, linear_fc1 -> GELU(tanh) or SwiGLU -> linear_fc2, whose weights are
// slices of two parameters:
// Under expert parallelism a rank holds its block of E / EP experts (E below is then that count);
// under expert tensor parallelism, of each expert its slice of F / ETP (F below is then that width;
// SwiGLU's weight1 holds this rank's gate rows, then its up rows, as tensor-parallel linear_fc1 does).
//   experts.weight1 [E, F or 2F (gate | up), H]: expert e's linear_fc1.weight is weight1[e]
//   experts.weight2 [E, H, F]:                   expert e's linear_fc2.weight is weight2[e]
// (Megatron's GroupedMLP stores the transposes, weight1 [H, E F] and weight2 [E F, H]; a converter
// maps expert e's [F, H] block onto weight1[:, e F : (e + 1) F]^T.)
// With --moe-grouped-gemm the GEMMs are te::grouped_linear (one kernel for all experts); without,
// a loop of linear() per expert over the same weights (the reference path).
// With an FP8 recipe in the context both GEMMs run through te::fp8_grouped_linear (either way);
// the delayed recipe's state is kept as float32 buffers fp8_fc{1,2}_{input,weight<e>,grad_output}_
// {amax_history,scale,scale_inv} (one weight state per expert) that travel in checkpoints.
#include <memory>
#include <optional>

#include "kiln/models/moe_spec.h"
#include "kiln/models/transformer_context.h"
#include "kiln/nn/module.h"
#include "kiln/te/fp8_grouped_linear.h"

namespace kiln::models {

class GroupedMlp : public nn::Module {
 public:
  GroupedMlp(const MoeSpec& spec, const LayerContext& context);
  // tokens [R, H] in expert-major order (this rank's experts), offsets [E + 1] int64 (rows past offsets[E]: zeros) ->
  // [R, H].
  Tensor forward(const Tensor& tokens, const Tensor& offsets);

  MoeSpec spec;
  std::int64_t num_local_experts = 0;  // spec.num_experts / the expert-parallel size
  Tensor weight1, weight2;

  bool is_fp8() const { return fp8_recipe_.has_value(); }

 private:
  Tensor activation(const Tensor& h) const;
  Tensor looped_linear(const Tensor& x, const Tensor& w, const std::vector<std::int64_t>& offsets) const;

  LayerContext context_;
  std::optional<te::Fp8Recipe> fp8_recipe_;
  te::Fp8GroupedLinearState fp8_fc1_, fp8_fc2_;  // delayed recipe only
};

}  // namespace kiln::models
