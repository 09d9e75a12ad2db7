#pragma once
// The MLP of a transformer layer (Megatron-core's): linear_fc1 -> GELU(tanh) or SwiGLU -> linear_fc2.
// With SwiGLU linear_fc1 has 2F rows, the gate's F rows first, then the up projection's. With tensor
// parallelism fc1 is column-parallel (SwiGLU: each half split alike, ParallelLinear's blocks = 2)
// and fc2 row-parallel: each rank computes F / tp of the hidden units.
#include <memory>

#include "kiln/models/transformer_linear.h"
#include "kiln/models/transformer_spec.h"

namespace kiln::models {

class Mlp : public nn::Module {
 public:
  Mlp(const MlpSpec& spec, const LayerContext& context);
  // [..., H] -> [..., H] (linear_fc2's bias included). fc1_cast: x's FP8 cast made by the fused
  // pre-MLP norm (x is then its placeholder). fuse_fp8: SwiGLU writes fc2's FP8 input cast itself
  // (te::swiglu_fp8), when fc2 takes one.
  Tensor forward(const Tensor& x, const Fp8Tensor* fc1_cast = nullptr, bool fuse_fp8 = false);

  MlpSpec spec;
  std::shared_ptr<ParallelLinear> linear_fc1, linear_fc2;

 private:
  LayerContext context_;
};

}  // namespace kiln::models
