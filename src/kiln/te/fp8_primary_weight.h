#pragma once
// An FP8 linear's weight kept in FP8 only (--fp8-param-gather; TransformerEngine's FP8 primary
// weights, fp8_model_init): the parameter itself holds the weight's fp8 bytes (rowwise [out, in],
// e4m3) and this struct the scaling that gives them meaning. No high-precision copy of the weight
// exists: the optimizer's fp32 master is the source of truth and is cast straight into these bytes
// after each step (fp8_primary_weights.h). fp8_linear takes the bytes as its fprop operand as they
// are and makes dgrad's columnwise operand (the cast of W^T) by an fp8 transpose of them
// (fp8_transposed), exact because per-tensor scales and 128x128 blocks are symmetric under
// transposition; the transpose is cached until the weight changes (te/fp8_weight_cache.h).
#include "kiln/te/fp8_recipe.h"
#include "kiln/tensor/fp8_tensor.h"

namespace kiln::te {

struct Fp8ScalingState;

struct Fp8PrimaryWeight {
  // data: the parameter (an fp8 [out, in] leaf that requires grad; its gradient accumulates in the
  // f32 or bf16 gradient buffer). scale / scale_inv: the delayed recipe's weight state's, else the
  // weight's own (per tensor, or 128x128 blocks with the blockwise recipe). amax: the last cast's.
  Fp8Tensor cast;
  DType value_dtype = DType::F32;            // the model's dtype: what state_dict() shows of the weight
  const Fp8ScalingState* delayed = nullptr;  // the weight's delayed-scaling state (delayed recipe)
};

// The weight's value: fp8 bytes times scale_inv, in value_dtype (what checkpoints save, as a run
// without --fp8-param-gather saves the weight).
Tensor fp8_primary_weight_value(const Fp8PrimaryWeight& w);

// Casts a whole high-precision weight (a checkpoint's, a master) into the bytes, with the recipe's
// scaling: delayed: the state's current scale (recording nothing; the state is left as it is);
// tensorwise: the value's own amax; blockwise: each 128x128 block's own power-of-two scale.
void fp8_primary_weight_quantize(const Fp8PrimaryWeight& w, const Tensor& value, const Fp8Recipe& recipe);

// The cast of W^T from W's cast: the bytes transposed; per tensor the same scales, 128x128 blocks
// the block grid transposed. Exactly the bytes and scales a cast of W^T gives. Refuses 1x128 tiles
// (not symmetric: a transpose would need a new cast).
Fp8Tensor fp8_transposed(const Fp8Tensor& w);

}  // namespace kiln::te
