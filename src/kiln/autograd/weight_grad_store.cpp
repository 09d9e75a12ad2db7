#include "kiln/autograd/weight_grad_store.h"

#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/autograd/record.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::autograd {

namespace {
thread_local WeightGradStore* t_active = nullptr;
}

WeightGradStore* WeightGradStore::active() { return t_active; }

void WeightGradStore::defer(std::function<void()> weight_grad) {
  KILN_CHECK(weight_grad != nullptr, "WeightGradStore::defer: an empty weight-gradient function");
  queue_.push_back(std::move(weight_grad));
}

void WeightGradStore::flush() {
  NoGradGuard no_grad;                           // as the engine runs backward formulas: nothing recorded
  AccumulatingBackwardScope accumulating(true);  // the queue accumulates into .grad, as run_backward
  // Moved out first: a weight gradient that throws leaves an empty store, not a half-run one.
  std::vector<std::function<void()>> queue = std::move(queue_);
  queue_.clear();
  for (auto& weight_grad : queue) weight_grad();
}

WeightGradStoreScope::WeightGradStoreScope(WeightGradStore* store) : previous_(t_active) { t_active = store; }
WeightGradStoreScope::~WeightGradStoreScope() { t_active = previous_; }

void accumulate_leaf_grad(const Tensor& leaf, Tensor grad) {
  const std::shared_ptr<Node> accumulator = grad_accumulator(leaf);
  // An undefined grad: the contribution was added in place (grad_accumulation_fusion.h); the
  // accumulator runs the hooks.
  KILN_CHECK(accumulator != nullptr, "accumulate_leaf_grad: {} is not a leaf that requires grad", leaf.describe());
  std::vector<Tensor> grads{std::move(grad)};
  accumulator->apply(std::move(grads));
}

}  // namespace kiln::autograd
