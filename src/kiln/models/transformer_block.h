#pragma once
// TransformerBlock (Megatron-core's "decoder"): the layers, then final_layernorm, with activation
// recompute as Megatron's --recompute-granularity full:
//   uniform: the layers in chunks of recompute_num_layers, each chunk recomputed as a whole;
//   block:   each of the first recompute_num_layers layers recomputed, the others not.
// (--recompute-granularity selective is the attention's: SelfAttentionSpec::recompute_core_attention.)
// Recompute is skipped with grad mode off and for forwards with a KvCache.
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/models/transformer_layer.h"
#include "kiln/nn/containers.h"
#include "kiln/tensor/random_generator.h"

namespace kiln::models {

// Activation recompute as --recompute-granularity full asks, counted over a run of layers.
struct LayerRecompute {
  RecomputeGranularity granularity = RecomputeGranularity::None;
  RecomputeMethod method = RecomputeMethod::Uniform;
  std::int64_t num_layers = 1;  // --recompute-num-layers
};

// `layers` in order on `hidden`, recomputed in the backward as `recompute` says, the layers counted
// from the first of `layers` (a pipeline stage's model chunk counts its own, as Megatron's
// TransformerBlock of a pipeline rank does). Recompute is skipped with grad mode off and for
// forwards with a KvCache.
Tensor forward_layers(const std::vector<std::shared_ptr<TransformerLayer>>& layers, const Tensor& hidden,
                      const PositionContext& positions, const LayerRecompute& recompute);

class TransformerBlock : public nn::Module {
 public:
  TransformerBlock(const GptConfig& config, Generator& seeds, const LayerContext& context);
  Tensor forward(const Tensor& hidden, const PositionContext& positions);  // [B, T, H], after the final norm

  std::int64_t num_layers() const { return static_cast<std::int64_t>(layers->size()); }
  std::shared_ptr<TransformerLayer> layer(std::int64_t i) const;

  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<TransformerNorm> final_layernorm;

 private:
  LayerRecompute recompute_;
};

}  // namespace kiln::models
