#pragma once
// A linear layer whose three GEMMs run in FP8 (TransformerEngine's te.Linear under fp8_autocast):
// fprop y = x W^T with x and W in e4m3, dgrad dx = dy W and wgrad dW = dy^T x with dy in e5m2
// (hybrid) or e4m3, each GEMM accumulating in f32 (cuBLASLt on CUDA, the float64 reference on the
// CPU). What is kept for the backward are the fp8 casts of x^T and W^T, not their high-precision
// values. The recipe (fp8_recipe.h) picks the scaling:
//  - delayed:    x, W and dy each cast with the scale of their Fp8ScalingState, whose amax history
//                the cast extends and fp8_delayed_scaling_update turns into the next scale, on the
//                device (one update per cast: with gradient accumulation, per micro-batch).
//  - tensorwise: each cast computes its scale from its own amax first.
//  - blockwise:  x and dy in 1x128 tiles, W in 128x128 blocks, power-of-two scales (DeepSeek-V3,
//                TE's Float8BlockScaling).
// Every GEMM takes its operands in the native K-contiguous form, so each operand is cast in both
// orientations at once (ops::fp8_quantize_transpose_into: one read of x for the rowwise cast fprop
// uses and the columnwise cast of x^T that wgrad uses; the same for W (dgrad) and dy (wgrad)); no
// fp8 transpose runs in the backward. Nothing is zero-filled: the casts' outputs are allocated
// uninitialised (ops::fp8_alloc) and written whole by the cast; with the delayed recipe the casts'
// `scale` aliases the state's (the GEMMs read the cast's own scale_inv). Optional, in the state:
//  - weight_cache: in calls that record a backward, W's casts are reused while W is unchanged
//    (te/fp8_weight_cache.h): once per optimizer step instead of once per micro-batch.
//  - updates: the delayed updates are queued on a group and run later in one launch for many
//    tensors (te/fp8_update_group.h) instead of one launch per call.
//  - amax_group: the layer's tensors are split over these processes (tensor / context parallelism):
//    per-tensor scales come from amaxes max-reduced over it (te/fp8_amax_reduction.h), the scales
//    of the whole tensors. Every call is then collective over the group.
#include <memory>
#include <optional>

#include "kiln/dist/communicator.h"
#include "kiln/te/fp8_recipe.h"
#include "kiln/tensor/fp8_tensor.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te {

class Fp8WeightCache;
class Fp8UpdateGroup;

// Delayed scaling's state of one tensor: amax_history f32 [L] (entry 0: the next cast's amax),
// scale and scale_inv f32 [1], all on the layer's device.
struct Fp8ScalingState {
  Tensor amax_history, scale, scale_inv;
  static Fp8ScalingState fresh(std::int64_t history_len, Device device);  // history 0, scale 1
};

struct Fp8PrimaryWeight;

// One linear layer's delayed-scaling state (its input, its weight and the gradient of its output),
// and the optional weight cache, update group and amax reduction group (see above). primary_weight:
// set when the weight parameter holds FP8 bytes (--fp8-param-gather, te/fp8_primary_weight.h): the
// layer then casts no weight (its scaling is the optimizer's master cast's) and reads the bytes as
// fprop's operand and their fp8 transpose as dgrad's (cached while the weight is unchanged).
struct Fp8LinearState {
  Fp8ScalingState input, weight, grad_output;
  std::shared_ptr<Fp8WeightCache> weight_cache = nullptr;
  std::shared_ptr<Fp8UpdateGroup> updates = nullptr;
  std::optional<dist::Communicator> amax_group = std::nullopt;  // unset: this process holds the whole tensors
  std::shared_ptr<Fp8PrimaryWeight> primary_weight = nullptr;
};

// x [..., in] (f32 or bf16), weight [out, in] (x's dtype, or the fp8 bytes of state->primary_weight), bias [out] or
// undefined -> [..., out] in x's dtype; differentiable in x, weight and bias. in, out and the number of rows of x must
// be multiples of 16 (FP8 GEMMs' rule). `state` is required with the delayed recipe (its tensors are updated in place);
// with the other recipes it may be null (its weight_cache is used if set).
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Fp8Recipe& recipe,
                  const Fp8LinearState* state);

// As above with x already cast by its producer (a fused norm or SwiGLU, te/fused_norm.h, swiglu.h):
// x_cast is x's rowwise cast made with the delayed recipe's input scale, its amax recorded into
// state->input's history[0] (the buffer fp8_linear_input_cast returns); x supplies only the shape,
// dtype and autograd edge and is not read. The backward's x^T is an fp8 transpose of x_cast's
// bytes (the same bytes a cast of x^T gives). Delayed recipe only.
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Fp8Recipe& recipe,
                  const Fp8LinearState* state, const Fp8Tensor& x_cast);

// The buffer a producer casts an FP8 linear's [rows, in] input into: uninitialised data, the
// state's input scale and its amax history[0] (delayed recipe).
Fp8Tensor fp8_linear_input_cast(const Fp8LinearState& state, const Fp8Recipe& recipe, std::int64_t rows,
                                std::int64_t in, Device device);

}  // namespace kiln::te
