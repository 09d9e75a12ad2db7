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
  if (spec.grouped_gemm)
    return te::grouped_linear(activation(te::grouped_linear(tokens, weight1, offsets)), weight2, offsets);
  const std::vector<std::int64_t> host = offsets.to(Device::cpu()).to_vector<std::int64_t>();
  if (tokens.size(0) == 0) return Tensor::zeros({0, spec.hidden_size}, tokens.dtype(), tokens.device());
  return looped_linear(activation(looped_linear(tokens, weight1, host)), weight2, host);
}

}  // namespace kiln::models
