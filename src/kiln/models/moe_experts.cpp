#include "kiln/models/moe_experts.h"

#include "kiln/autograd/functions.h"
#include "kiln/models/transformer_linear.h"
#include "kiln/runtime/error.h"
#include "kiln/te/moe.h"

namespace kiln::models {

GroupedMlp::GroupedMlp(const MoeSpec& spec, const LayerContext& context)
    : Module("GroupedMLP"), spec(spec), context_(context) {
  // Expert parallelism: this rank's block of num_experts / size experts; expert tensor parallelism:
  // of each, its slice of F (linear_fc1's rows, the gate's and the up projection's alike; linear_fc2's
  // columns). GptModel initialises them as slices of the whole stack; checkpoints gather them whole.
  const int ep = context.expert_parallel_size(), etp = context.expert_tensor_parallel_size();
  KILN_CHECK(spec.num_experts % ep == 0, "MoE experts: {} experts do not split over {} expert-parallel ranks",
             spec.num_experts, ep);
  KILN_CHECK(spec.ffn_hidden_size % etp == 0,
             "MoE experts: the experts' hidden size {} does not split over {} expert-tensor-parallel ranks",
             spec.ffn_hidden_size, etp);
  const std::int64_t f = spec.ffn_hidden_size / etp, h = spec.hidden_size;
  const std::int64_t fc1_rows = spec.activation == MlpActivation::SwiGLU ? 2 * f : f;
  num_local_experts = spec.num_experts / ep;
  weight1 = register_parameter("weight1", Tensor::zeros({num_local_experts, fc1_rows, h}));
  weight2 = register_parameter("weight2", Tensor::zeros({num_local_experts, h, f}));
  if (context.fp8 == nullptr) return;
  // The experts' FP8 scaling state is per expert and the expert-parallel checkpoint code gathers the
  // weights only: the two together are not done yet.
  KILN_CHECK(ep == 1 && etp == 1,
             "--fp8-format with --expert-model-parallel-size {} / --expert-tensor-parallel-size {}: FP8 experts run "
             "whole on one rank only so far; leave the parallel sizes out",
             ep, etp);
  fp8_recipe_ = *context.fp8;
  if (fp8_recipe_->recipe != te::Fp8ScalingRecipe::Delayed) return;
  const std::int64_t len = fp8_recipe_->amax_history_len;
  auto add_state = [&](const std::string& name, te::Fp8ScalingState& s) {
    register_fp8_scaling_state(*this, name, len, s);
  };
  for (auto [fc, st] : {std::pair{"fc1", &fp8_fc1_}, std::pair{"fc2", &fp8_fc2_}}) {
    add_state(std::string(fc) + "_input", st->input);
    st->weight.resize(static_cast<std::size_t>(num_local_experts));
    for (std::int64_t e = 0; e < num_local_experts; ++e)
      add_state(std::string(fc) + "_weight" + std::to_string(e), st->weight[static_cast<std::size_t>(e)]);
    add_state(std::string(fc) + "_grad_output", st->grad_output);
  }
}

Tensor GroupedMlp::activation(const Tensor& h) const {
  return spec.activation == MlpActivation::SwiGLU ? context_.ops->swiglu(h) : gelu(h, /*tanh_approximation=*/true);
}

Tensor GroupedMlp::looped_linear(const Tensor& x, const Tensor& w, const std::vector<std::int64_t>& offsets) const {
  std::vector<Tensor> parts;
  for (std::int64_t e = 0; e < num_local_experts; ++e) {
    const std::int64_t lo = offsets[static_cast<std::size_t>(e)], hi = offsets[static_cast<std::size_t>(e) + 1];
    if (hi > lo) parts.push_back(linear(x.narrow(0, lo, hi - lo), w.select(0, e)));
  }
  const std::int64_t used = offsets.back(), rows = x.size(0);
  if (used < rows) parts.push_back(Tensor::zeros({rows - used, w.size(1)}, x.dtype(), x.device()));
  return parts.size() == 1 ? parts[0] : cat(parts, 0);
}

Tensor GroupedMlp::forward(const Tensor& tokens, const Tensor& offsets) {
  // No rows (an expert-parallel rank no token was routed to): the empty input, so the graph through
  // it (and the dispatcher's collectives in its backward) stays the same on every rank, plus zero
  // times the weights, so their (zero) gradients become ready at the same point of backward as on
  // the other ranks (overlapped bucket reductions start in the same order everywhere).
  if (tokens.size(0) == 0) return add(tokens, mul(add(sum(weight1), sum(weight2)), 0.0));
  if (fp8_recipe_) {
    const te::Fp8Recipe& r = *fp8_recipe_;
    const Tensor h = activation(te::fp8_grouped_linear(tokens, weight1, offsets, r, &fp8_fc1_));
    return te::fp8_grouped_linear(h, weight2, offsets, r, &fp8_fc2_);
  }
  if (spec.grouped_gemm)
    return te::grouped_linear(activation(te::grouped_linear(tokens, weight1, offsets)), weight2, offsets);
  const std::vector<std::int64_t> host = offsets.to(Device::cpu()).to_vector<std::int64_t>();
  return looped_linear(activation(looped_linear(tokens, weight1, host)), weight2, host);
}

}  // namespace kiln::models
