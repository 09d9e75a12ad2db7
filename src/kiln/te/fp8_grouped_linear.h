#pragma once
// The MoE experts' grouped linear layer with its three GEMMs in FP8 (TransformerEngine's
// te.GroupedLinear under fp8_autocast, as Megatron's TEGroupedMLP runs it): for the rows r of
// expert e (offsets[e] <= r < offsets[e + 1], expert-major as te::grouped_linear takes them)
//   fprop y[r] = x[r] W_e^T,  dgrad dx[r] = dy[r] W_e,  wgrad dW_e = sum_r dy[r]^T x[r]
// with x and W in e4m3 and dy in e5m2 (hybrid) or e4m3, one FP8 GEMM per expert (cuBLASLt on CUDA,
// the float64 reference on the CPU: ops::fp8_gemm), after one read-back of the offsets to the host
// (TE's m_splits are host integers too; te/cuda/grouped_gemm_cublas.h for the bf16 twin).
//
// Token counts per expert are arbitrary, but FP8 GEMMs need the contracted dimension a multiple of
// 16 (wgrad contracts over the expert's tokens): each expert's rows are padded with zero rows to the
// next multiple of 16 before the casts and the padding is dropped after the GEMMs (TE's Fp8Padding /
// Fp8Unpadding around GroupedLinear). Zero rows change no amax and add nothing to dW.
//
// Scaling, per recipe (fp8_recipe.h):
//  - delayed:    one Fp8ScalingState for the grouped input (all experts' rows, cast once), one per
//                expert weight, one for the grouped output gradient (cast once); each cast extends
//                its state's amax history and fp8_delayed_scaling_update turns it into the next scale.
//  - tensorwise: the same casts, each scale from the cast tensor's own amax.
//  - blockwise:  per expert, x and dy in 1x128 tiles and W_e in 128x128 blocks, power-of-two scales,
//                each also cast along its other axis for the backward (the block scales run along
//                the contracted dimension, which for wgrad is the expert's tokens).
// The rows past offsets[E] (unused buffer rows) give zero outputs and gradients.
// Not CUDA-graph capturable (the read-back synchronises): refused while a capture is active.
#include <vector>

#include "kiln/te/fp8_linear.h"

namespace kiln::te {

struct Fp8GroupedLinearState {
  Fp8ScalingState input;
  std::vector<Fp8ScalingState> weight;  // one per expert
  Fp8ScalingState grad_output;
};

// x [R, K] (f32 or bf16), weight [E, O, K] (x's dtype), offsets [E + 1] int64 on x's device ->
// y [R, O] in x's dtype; differentiable in x and weight. K and O must be multiples of 16. `state` is
// required with the delayed recipe (its tensors are updated in place, weight.size() == E) and
// ignored by the others.
Tensor fp8_grouped_linear(const Tensor& x, const Tensor& weight, const Tensor& offsets, const Fp8Recipe& recipe,
                          const Fp8GroupedLinearState* state);

}  // namespace kiln::te
