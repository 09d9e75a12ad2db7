#pragma once
// TransformerLayer (Megatron-core's, pre-norm):
//   residual = hidden
//   x = self_attention(input_layernorm(hidden));  hidden = residual + dropout(x)
//   x = mlp(pre_mlp_layernorm(hidden));          hidden = hidden + dropout(x)
// The residual add before pre_mlp_layernorm goes through the norm's fused add (TransformerNorm).
// FP8 with the delayed recipe: the layer's four linears queue their amax/scale updates on one group
// (te/fp8_update_group.h), flushed in one launch at the end of the forward and once the layer's
// backward has run, instead of one launch per cast; with the TransformerEngine ops the norms and
// SwiGLU write the next linear's FP8 input directly (no bf16 output, no separate cast).
#include <cstdint>
#include <memory>

#include "kiln/models/moe_layer.h"
#include "kiln/models/transformer_attention.h"
#include "kiln/models/transformer_mla.h"
#include "kiln/models/transformer_mlp.h"
#include "kiln/models/transformer_norm.h"
#include "kiln/te/fp8_update_group.h"
#include "kiln/tensor/random_generator.h"

namespace kiln::models {

class TransformerLayer : public nn::Module {
 public:
  // Dropout seeds come from `seeds` (one per dropout module).
  TransformerLayer(const TransformerLayerSpec& spec, std::int64_t layer_number, Generator& seeds,
                   const LayerContext& context);
  Tensor forward(const Tensor& hidden, const PositionContext& positions);  // [B, T, H] -> [B, T, H]

  TransformerLayerSpec spec;
  std::shared_ptr<TransformerNorm> input_layernorm, pre_mlp_layernorm;
  std::shared_ptr<SelfAttention> self_attention;  // null with MLA
  // MLA: registered as "self_attention" in its place (Megatron's names) when spec.mla.enabled.
  std::shared_ptr<MlaSelfAttention> mla_self_attention;
  std::shared_ptr<Mlp> mlp;
  std::shared_ptr<MoeLayer> moe;  // MoE: registered as "mlp" on MoE layers, where mlp is null
  std::shared_ptr<nn::Dropout> self_attn_dropout, mlp_dropout;  // hidden dropout before each residual add
  // Whether the norms / SwiGLU write the FP8 linears' inputs (delayed FP8 with te's ops).
  bool fp8_fused_casts() const { return fp8_fused_casts_; }

 private:
  std::shared_ptr<te::Fp8UpdateGroup> fp8_updates_;  // delayed FP8 only
  // Delayed FP8 with the TransformerEngine ops: the norms (and SwiGLU) write the following FP8
  // linears' input casts themselves (te::add_*_norm_fp8, te::swiglu_fp8).
  bool fp8_fused_casts_ = false;
};

}  // namespace kiln::models
