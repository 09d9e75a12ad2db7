#include "kiln/models/transformer_norm.h"

#include <fmt/format.h>

#include "kiln/te/fused_norm.h"

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

std::pair<Tensor, Tensor> TransformerNorm::forward_fp8(const Tensor& x, const Tensor& residual, const Fp8Tensor& y8) {
  if (spec.kind == Normalization::LayerNorm) return te::add_layer_norm_fp8(x, residual, weight, bias, spec.eps, y8);
  return te::add_rms_norm_fp8(x, residual, weight, spec.eps, y8);
}

std::string TransformerNorm::extra_repr() const { return fmt::format("({},), eps={}", spec.size, spec.eps); }

}  // namespace kiln::models
