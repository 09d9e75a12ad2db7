#pragma once
// The linear layers of a transformer, named as Megatron-core's: ColumnParallelLinear (linear_qkv,
// linear_fc1: output rows split over the tensor-parallel group) and RowParallelLinear (linear_proj,
// linear_fc2: input columns split, outputs all-reduced). With a tensor-parallel group of size 1
// (LayerContext) both are y = x W^T + b with W [out, in]; the split and the collectives are the
// parallel issue's to add here. Parameters are created uninitialised: GptModel initialises them.
#include <cstdint>

#include "kiln/models/transformer_context.h"
#include "kiln/nn/module.h"

namespace kiln::models {

enum class ParallelLinearKind { Column, Row };

class ParallelLinear : public nn::Module {
 public:
  ParallelLinear(ParallelLinearKind kind, std::int64_t in_features, std::int64_t out_features, bool bias,
                 const LayerContext& context);
  Tensor forward(const Tensor& x);
  std::string extra_repr() const override;

  ParallelLinearKind kind;
  std::int64_t in_features, out_features;
  Tensor weight, bias;  // bias undefined without one
};

}  // namespace kiln::models
