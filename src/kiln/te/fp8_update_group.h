#pragma once
// Delayed scaling's updates batched (TransformerEngine updates every FP8 tensor's amax history and
// scale once per step, in one kernel, instead of one launch per tensor). A cast records its amax
// into its state's history[0] and queues the state here; flush() runs every queued update in one
// ops::fp8_delayed_scaling_update_many launch. The update of a state must run before that state's
// next cast (which overwrites history[0]): a transformer layer flushes at the end of its forward
// (its inputs' and weights' casts) and, through fp8_flush_on_backward on its input, once its whole
// backward has run (its gradients' casts), so every update lands where the unbatched one would.
// With an amax reduction group (tensor / context parallelism) flush() first max-reduces every queued
// amax over it in one all-reduce (te/fp8_amax_reduction.h): a collective, so every rank of the group
// flushes at the same points with the same states queued in the same order.
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "kiln/ops/fp8.h"
#include "kiln/te/fp8_linear.h"

namespace kiln::te {

class Fp8UpdateGroup {
 public:
  explicit Fp8UpdateGroup(ops::AmaxComputeAlgo algo, std::optional<dist::Communicator> amax_group = std::nullopt)
      : algo_(algo), amax_group_(std::move(amax_group)) {}
  void queue(const Fp8ScalingState& state, float scaled_max);
  // One launch for every queued update (none when the queue is empty), after the amax reduction.
  void flush();
  std::size_t pending() const;

 private:
  ops::AmaxComputeAlgo algo_;
  std::optional<dist::Communicator> amax_group_;
  mutable std::mutex mutex_;  // the backward may run on another thread than the forward
  std::vector<ops::Fp8DelayedScalingRef> pending_;
};

// x unchanged; its backward flushes `group` when x's gradient is complete, i.e. after the backward
// of every op that consumed x. Put at a layer's input, that is after the layer's whole backward.
Tensor fp8_flush_on_backward(const Tensor& x, const std::shared_ptr<Fp8UpdateGroup>& group);

}  // namespace kiln::te
