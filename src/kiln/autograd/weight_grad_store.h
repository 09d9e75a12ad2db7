#pragma once
// A weight-gradient store, the split backward of zero-bubble pipeline parallelism (Qi et al. 2023;
// Megatron's WeightGradStore): while a store is active on the thread that runs backward, the
// functions that can split their backward (`linear`; te::linear_gelu_linear) compute the input
// gradient at once and queue the weight- and bias-gradient GEMMs, with what those need (the saved
// input, the output gradient), instead of running them. flush() runs the queue later (the
// pipeline's W pass), each gradient accumulated into its parameter's .grad exactly as the engine's
// AccumulateGrad would (dtype conversion into an fp32 .grad, grad-ready hooks), so
// deferred-then-flushed equals the plain backward bit for bit for a weight used once per backward.
//
//   autograd::WeightGradStore store;
//   {
//     autograd::WeightGradStoreScope defer(&store);
//     loss.backward();      // input gradients now; linear weights' gradients queued
//   }
//   send(input.grad());     // the previous pipeline stage need not wait for the weight gradients
//   store.flush();          // W: the weight gradients into .grad
//
// Only leaves are deferred (a parameter used directly): a weight reached through another op (an
// autocast copy) has its gradient computed in the backward as usual. autograd::grad() (activation
// recompute's inner backward) never defers: it returns gradients instead of accumulating them.
#include <cstddef>
#include <functional>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::autograd {

class WeightGradStore {
 public:
  WeightGradStore() = default;
  WeightGradStore(const WeightGradStore&) = delete;
  WeightGradStore& operator=(const WeightGradStore&) = delete;
  WeightGradStore(WeightGradStore&&) = default;
  WeightGradStore& operator=(WeightGradStore&&) = default;

  // The store backward on this thread defers into (WeightGradStoreScope), or null.
  static WeightGradStore* active();

  void defer(std::function<void()> weight_grad);
  std::size_t size() const { return queue_.size(); }
  bool empty() const { return queue_.empty(); }
  // Runs the queued weight gradients in the order they were queued (grad mode off), then empties
  // the queue.
  void flush();

 private:
  std::vector<std::function<void()>> queue_;
};

// While alive, `store` is the active store of this thread (null: none); restores the previous one.
class WeightGradStoreScope {
 public:
  explicit WeightGradStoreScope(WeightGradStore* store);
  ~WeightGradStoreScope();
  WeightGradStoreScope(const WeightGradStoreScope&) = delete;
  WeightGradStoreScope& operator=(const WeightGradStoreScope&) = delete;

 private:
  WeightGradStore* previous_;
};

// Adds `grad` to leaf `leaf`'s .grad as the engine's AccumulateGrad does (the same in-place add or
// conversion, then the leaf's grad-ready hooks). `leaf` must be a leaf that requires grad. An
// undefined `grad` after add_weight_grad_into_main_grad(leaf, ...) (grad_accumulation_fusion.h),
// which added the contribution in place, runs the hooks alone.
void accumulate_leaf_grad(const Tensor& leaf, Tensor grad);

}  // namespace kiln::autograd
