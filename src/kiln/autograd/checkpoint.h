#pragma once
// Activation recompute (torch.utils.checkpoint, Megatron's --recompute-granularity full):
//
//   Tensor y = autograd::checkpoint([&](const std::vector<Tensor>& in) { return layer.forward(in[0]); }, {x});
//
// runs fn(inputs) with grad mode off, so none of its activations are kept; y gets one graph node
// whose backward runs fn again with grad mode on and backpropagates through that recomputed
// graph. The recompute sees what the first run saw: the default generator's position
// (tensor/random_generator.h), the dropout masks of stateful random modules (replayed, see
// random_replay.h; graph-safe dropout included) and the autocast dtype. So the gradients are
// bit-identical to running fn without recompute, wherever each tensor's gradient contributions
// all come from inside fn or all from outside it (floating-point sums are otherwise regrouped).
//
// The parameters fn uses (leaves that require grad) are found while it first runs; their
// gradients flow out of the checkpoint node into their usual accumulators, so a parameter's
// grad-ready hook fires once per backward, after its last contribution, checkpointed or not.
// fn must take every non-parameter tensor that requires grad through `inputs` (one it captures
// instead is refused), must not change its control flow between the two runs (checked: the
// parameters and random draws must match), and must not modify its inputs in place.
// With grad mode off (evaluation, or inside another checkpoint's first run) fn simply runs.
#include <functional>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::autograd {

using CheckpointFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

std::vector<Tensor> checkpoint(const CheckpointFunction& fn, const std::vector<Tensor>& inputs);
// One output.
Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>& inputs)>& fn,
                  const std::vector<Tensor>& inputs);

}  // namespace kiln::autograd
