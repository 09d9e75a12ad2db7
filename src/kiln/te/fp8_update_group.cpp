#include "kiln/te/fp8_update_group.h"

#include "kiln/autograd/record.h"
#include "kiln/te/fp8_amax_reduction.h"

namespace kiln::te {

void Fp8UpdateGroup::queue(const Fp8ScalingState& state, float scaled_max) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back({state.amax_history, state.scale, state.scale_inv, scaled_max});
}

void Fp8UpdateGroup::flush() {
  std::vector<ops::Fp8DelayedScalingRef> run;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    run.swap(pending_);
  }
  if (amax_group_) reduce_recorded_amaxes(run, *amax_group_);
  ops::fp8_delayed_scaling_update_many(run, algo_);
}

std::size_t Fp8UpdateGroup::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.size();
}

Tensor fp8_flush_on_backward(const Tensor& x, const std::shared_ptr<Fp8UpdateGroup>& group) {
  if (!group || !autograd::needs_grad({x})) return x;
  Tensor y = x.detach();
  autograd::record("Fp8UpdateFlush", {x}, {&y}, [group](const autograd::Grads& g) -> autograd::Grads {
    group->flush();
    return {g[0]};
  });
  return y;
}

}  // namespace kiln::te
