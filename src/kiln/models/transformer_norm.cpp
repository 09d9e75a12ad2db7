#include "kiln/models/transformer_norm.h"

#include <fmt/format.h>

namespace kiln::models {

TransformerNorm::TransformerNorm(const NormSpec& spec, const LayerContext& context)
    : Module(spec.kind == Normalization::LayerNorm ? "LayerNorm" : "RMSNorm"), spec(spec), context_(context) {
  weight = register_parameter("weight", Tensor::ones({spec.size}));
  if (spec.kind == Normalization::LayerNorm) bias = register_parameter("bias", Tensor::zeros({spec.size}));
}

std::pair<Tensor, Tensor> TransformerNorm::forward(const Tensor& x, const Tensor& residual) {
  if (spec.kind == Normalization::LayerNorm) return context_.ops->add_layer_norm(x, residual, weight, bias, spec.eps);
  return context_.ops->add_rms_norm(x, residual, weight, spec.eps);
}

std::string TransformerNorm::extra_repr() const { return fmt::format("({},), eps={}", spec.size, spec.eps); }

}  // namespace kiln::models
