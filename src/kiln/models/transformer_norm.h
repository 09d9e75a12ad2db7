#pragma once
// The norms of a transformer layer (input_layernorm, pre_mlp_layernorm, final_layernorm):
// LayerNorm (weight and bias) or RMSNorm (weight), with the residual add before it folded in, as
// TransformerEngine's fused norms take it: forward(x, residual) = (norm(x + residual), x + residual).
#include <utility>

#include "kiln/models/transformer_context.h"
#include "kiln/models/transformer_spec.h"
#include "kiln/nn/module.h"

namespace kiln::models {

class TransformerNorm : public nn::Module {
 public:
  TransformerNorm(const NormSpec& spec, const LayerContext& context);
  // residual undefined: norm(x) and x.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& residual = Tensor());
  // The FP8-output form (te::add_*_norm_fp8): the normalised output goes to y8, the FP8 input cast
  // of the linear that consumes it; the first tensor returned is that linear's placeholder input.
  std::pair<Tensor, Tensor> forward_fp8(const Tensor& x, const Tensor& residual, const Fp8Tensor& y8);
  std::string extra_repr() const override;

  NormSpec spec;
  Tensor weight, bias;  // bias only for LayerNorm

 private:
  LayerContext context_;
};

}  // namespace kiln::models
