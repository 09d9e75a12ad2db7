#include "kiln/autograd/grad_ready_hook.h"

#include "kiln/autograd/node.h"
#include "kiln/autograd/record.h"

namespace kiln::autograd {

GradReadyHookHandle& GradReadyHookHandle::operator=(GradReadyHookHandle&& other) noexcept {
  if (this != &other) {
    remove();
    node_ = std::move(other.node_);
    id_ = other.id_;
  }
  return *this;
}

void GradReadyHookHandle::remove() {
  if (node_) node_->remove_hook(id_);
  node_.reset();
}

GradReadyHookHandle register_grad_ready_hook(const Tensor& leaf, std::function<void(const Tensor& leaf)> hook) {
  KILN_CHECK(leaf.defined(), "register_grad_ready_hook: the tensor is undefined");
  KILN_CHECK(leaf.is_leaf() && leaf.requires_grad(),
             "register_grad_ready_hook: {} must be a leaf that requires grad (a parameter)", leaf.describe());
  auto node = std::static_pointer_cast<AccumulateGrad>(grad_accumulator(leaf));
  const std::uint64_t id = node->add_hook(std::move(hook));
  return GradReadyHookHandle(std::move(node), id);
}

}  // namespace kiln::autograd
