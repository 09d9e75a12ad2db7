#include "kiln/models/moe_experts.h"

#include "kiln/autograd/functions.h"
#include "kiln/te/moe.h"

namespace kiln::models {

GroupedMlp::GroupedMlp(const MoeSpec& spec, const LayerContext& context)
    : Module("GroupedMLP"), spec(spec), context_(context) {
  const std::int64_t f = spec.ffn_hidden_size, h = spec.hidden_size;
  const std::int64_t fc1_rows = spec.activation == MlpActivation::SwiGLU ? 2 * f : f;
  weight1 = register_parameter("weight1", Tensor::zeros({spec.num_experts, fc1_rows, h}));
  weight2 = register_parameter("weight2", Tensor::zeros({spec.num_experts, h, f}));
  if (context.fp8 == nullptr) return;
  fp8_recipe_ = *context.fp8;
  if (fp8_recipe_->recipe != te::Fp8ScalingRecipe::Delayed) return;
  const std::int64_t len = fp8_recipe_->amax_history_len;
  auto add_state = [&](const std::string& name, te::Fp8ScalingState& s) {
    s = te::Fp8ScalingState::fresh(len, Device::cpu());
    s.amax_history = register_buffer("fp8_" + name + "_amax_history", s.amax_history, true, /*keep_dtype=*/true);
    s.scale = register_buffer("fp8_" + name + "_scale", s.scale, true, /*keep_dtype=*/true);
    s.scale_inv = register_buffer("fp8_" + name + "_scale_inv", s.scale_inv, true, /*keep_dtype=*/true);
  };
  for (auto [fc, st] : {std::pair{"fc1", &fp8_fc1_}, std::pair{"fc2", &fp8_fc2_}}) {
    add_state(std::string(fc) + "_input", st->input);
    st->weight.resize(static_cast<std::size_t>(spec.num_experts));
    for (std::int64_t e = 0; e < spec.num_experts; ++e)
      add_state(std::string(fc) + "_weight" + std::to_string(e), st->weight[static_cast<std::size_t>(e)]);
    add_state(std::string(fc) + "_grad_output", st->grad_output);
  }
}

Tensor GroupedMlp::activation(const Tensor& h) const {
  return spec.activation == MlpActivation::SwiGLU ? context_.ops->swiglu(h) : gelu(h, /*tanh_approximation=*/true);
}

Tensor GroupedMlp::looped_linear(const Tensor& x, const Tensor& w, const std::vector<std::int64_t>& offsets) const {
  std::vector<Tensor> parts;
  for (std::int64_t e = 0; e < spec.num_experts; ++e) {
    const std::int64_t lo = offsets[static_cast<std::size_t>(e)], hi = offsets[static_cast<std::size_t>(e) + 1];
    if (hi > lo) parts.push_back(linear(x.narrow(0, lo, hi - lo), w.select(0, e)));
  }
  const std::int64_t used = offsets.back(), rows = x.size(0);
  if (used < rows) parts.push_back(Tensor::zeros({rows - used, w.size(1)}, x.dtype(), x.device()));
  return parts.size() == 1 ? parts[0] : cat(parts, 0);
}

Tensor GroupedMlp::forward(const Tensor& tokens, const Tensor& offsets) {
  if (fp8_recipe_) {
    const te::Fp8Recipe& r = *fp8_recipe_;
    const Tensor h = activation(te::fp8_grouped_linear(tokens, weight1, offsets, r, &fp8_fc1_));
    return te::fp8_grouped_linear(h, weight2, offsets, r, &fp8_fc2_);
  }
  if (spec.grouped_gemm)
    return te::grouped_linear(activation(te::grouped_linear(tokens, weight1, offsets)), weight2, offsets);
  const std::vector<std::int64_t> host = offsets.to(Device::cpu()).to_vector<std::int64_t>();
  if (tokens.size(0) == 0) return Tensor::zeros({0, spec.hidden_size}, tokens.dtype(), tokens.device());
  return looped_linear(activation(looped_linear(tokens, weight1, host)), weight2, host);
}

}  // namespace kiln::models
