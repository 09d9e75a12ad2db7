#pragma once
// A grad-ready hook: called when a leaf's gradient for the running backward is complete, i.e.
// when every contribution has been summed into leaf.grad (a parameter used twice calls it once,
// after the second contribution). Data parallelism starts a bucket's reduction from it while the
// rest of backward still runs (optim/grad_buffers.h builds bucket-ready notifications on it).
//
//   auto handle = autograd::register_grad_ready_hook(w, [](const Tensor& w) { ... w.grad() ... });
//
// The hook runs on the thread that runs backward, in the engine's order (reverse creation order
// of the graph). It is not called when no gradient reaches the leaf, nor from autograd::grad()
// (which returns gradients instead of accumulating them). The handle keeps the hook (and the
// leaf's accumulator node) alive; destroying it removes the hook.
#include <cstdint>
#include <functional>
#include <memory>

#include "kiln/tensor/tensor.h"

namespace kiln::autograd {

class AccumulateGrad;

class GradReadyHookHandle {
 public:
  GradReadyHookHandle() = default;
  GradReadyHookHandle(std::shared_ptr<AccumulateGrad> node, std::uint64_t id) : node_(std::move(node)), id_(id) {}
  ~GradReadyHookHandle() { remove(); }
  GradReadyHookHandle(GradReadyHookHandle&& other) noexcept : node_(std::move(other.node_)), id_(other.id_) {}
  GradReadyHookHandle& operator=(GradReadyHookHandle&& other) noexcept;
  GradReadyHookHandle(const GradReadyHookHandle&) = delete;
  GradReadyHookHandle& operator=(const GradReadyHookHandle&) = delete;

  void remove();  // idempotent
  bool active() const { return node_ != nullptr; }

 private:
  std::shared_ptr<AccumulateGrad> node_;
  std::uint64_t id_ = 0;
};

// `leaf` must be a leaf tensor that requires grad.
[[nodiscard]] GradReadyHookHandle register_grad_ready_hook(const Tensor& leaf,
                                                           std::function<void(const Tensor& leaf)> hook);

}  // namespace kiln::autograd
