#include "kiln/autograd/grad_accumulation_fusion.h"

#include <atomic>

#include "kiln/autograd/node.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/linalg.h"

namespace kiln::autograd {

namespace {
std::atomic<bool> g_fusion{false};
thread_local bool t_accumulating = false;
}  // namespace

GradientAccumulationFusionScope::GradientAccumulationFusionScope(bool on) : previous_(g_fusion.exchange(on)) {}
GradientAccumulationFusionScope::~GradientAccumulationFusionScope() { g_fusion.store(previous_); }
bool gradient_accumulation_fusion() { return g_fusion.load(std::memory_order_relaxed); }

AccumulatingBackwardScope::AccumulatingBackwardScope(bool accumulating) : previous_(t_accumulating) {
  t_accumulating = accumulating;
}
AccumulatingBackwardScope::~AccumulatingBackwardScope() { t_accumulating = previous_; }

Tensor fusable_main_grad(const Tensor& weight) {
  if (!t_accumulating || !gradient_accumulation_fusion()) return Tensor();
  if (!weight.defined() || !weight.is_leaf() || !weight.requires_grad()) return Tensor();
  // 16-bit weights, and FP8 primary weights (--fp8-param-gather), whose fp32 .grad is the master's.
  const DType wt = weight.dtype();
  if (wt != DType::BF16 && wt != DType::F16 && wt != DType::F8E4M3 && wt != DType::F8E5M2) return Tensor();
  Tensor main_grad = weight.grad();
  if (!main_grad.defined() || main_grad.dtype() != DType::F32 || !main_grad.is_contiguous() ||
      main_grad.device() != weight.device() || main_grad.shape() != weight.shape())
    return Tensor();
  return main_grad;
}

bool add_weight_grad_into_main_grad(const Tensor& weight, const Tensor& dy, const Tensor& x) {
  const Tensor main_grad = fusable_main_grad(weight);
  if (!main_grad.defined() || weight.dim() != 2) return false;
  const std::int64_t out = weight.shape()[0], in = weight.shape()[1];
  const Tensor target = make_view(main_grad, {1, out, in}, {out * in, in, 1}, main_grad.storage_offset());
  ops::gemm_into(dy, x, target, /*trans_a=*/true, /*trans_b=*/false, 1.0, 1.0);
  note_main_grad_accumulated(weight);
  return true;
}

void note_main_grad_accumulated(const Tensor& weight) {
  std::static_pointer_cast<AccumulateGrad>(grad_accumulator(weight))->note_accumulated_in_place();
}

}  // namespace kiln::autograd
