#include "kiln/te/fp8_amax_reduction.h"

#include "kiln/autograd/functions.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::te {

void reduce_recorded_amaxes(const std::vector<ops::Fp8DelayedScalingRef>& states, const dist::Communicator& group) {
  if (states.empty() || group.size() == 1) return;
  NoGradGuard no_grad;
  std::vector<Tensor> recorded;
  recorded.reserve(states.size());
  for (const ops::Fp8DelayedScalingRef& s : states) recorded.push_back(s.amax_history.narrow(0, 0, 1));
  // One buffer, one all-reduce for all of them (TE's fused amax reduction).
  const Tensor all = cat(recorded, 0).contiguous();
  dist::all_reduce(group, all, dist::ReduceOp::Max).wait();
  for (std::size_t i = 0; i < recorded.size(); ++i) recorded[i].copy_(all.narrow(0, static_cast<std::int64_t>(i), 1));
}

Tensor group_current_scale(const Tensor& x, DType fp8_dtype, const dist::Communicator& group) {
  NoGradGuard no_grad;
  // max |x| is one of x's values: exact in x's dtype and in float32.
  const Tensor amax = kiln::amax(kiln::abs(x)).to(DType::F32).reshape({1, 1}).contiguous();
  dist::all_reduce(group, amax, dist::ReduceOp::Max).wait();
  // The scale of a current-scaling cast of the 1x1 matrix [global amax]: scale_from_amax of it, by
  // the cast kernels themselves (no host round trip, the same arithmetic on every backend).
  ops::Fp8CastOptions current;
  current.current_scaling = true;
  return ops::fp8_quantize(amax, fp8_dtype, ScalingLayout::PerTensor, current).scale;
}

}  // namespace kiln::te
