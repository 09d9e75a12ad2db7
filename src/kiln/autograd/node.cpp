#include "kiln/autograd/node.h"

#include <atomic>
#include <limits>
#include <utility>

#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"

namespace kiln::autograd {

namespace {
std::atomic<std::uint64_t> g_next_sequence_nr{0};
}

Node::Node(std::string name, int num_outputs)
    : name_(std::move(name)), num_outputs_(num_outputs), sequence_nr_(g_next_sequence_nr++) {}

Node::Node(std::string name, int num_outputs, std::uint64_t sequence_nr)
    : name_(std::move(name)), num_outputs_(num_outputs), sequence_nr_(sequence_nr) {}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
    : Node("AccumulateGrad", 1, std::numeric_limits<std::uint64_t>::max()), leaf_(std::move(leaf)) {}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor& g = grads[0];
  const bool accumulated_in_place = std::exchange(accumulated_in_place_, false);
  if (!g.defined() && !accumulated_in_place) return {};
  if (g.defined()) accumulate(g);
  if (!hooks_.empty()) {
    const Tensor leaf(leaf_);
    // By index: a hook may add or remove hooks.
    for (std::size_t i = 0; i < hooks_.size(); ++i) {
      Hook hook = hooks_[i].second;
      hook(leaf);
    }
  }
  return {};
}

void AccumulateGrad::accumulate(const Tensor& g) {
  KILN_CHECK(g.shape() == leaf_->shape, "gradient of shape {} for a leaf of shape {}", shape_str(g.shape()),
             shape_str(leaf_->shape));
  if (!leaf_->grad) {
    // Keep the incoming buffer when nothing else refers to it; otherwise copy, so that later
    // accumulation cannot write into a tensor the user holds.
    Tensor owned = g.impl_ptr().use_count() == 1 && g.is_contiguous() ? g : ops::contiguous(g.detach().clone());
    leaf_->grad = owned.impl_ptr();
  } else {
    Tensor acc(leaf_->grad);
    // A low-precision gradient into a float accumulator (bf16 weights' fp32 main gradients): one
    // pass, not a conversion and then an add.
    if (g.dtype() != acc.dtype() && g.device() == acc.device() && is_floating(g.dtype()) &&
        (acc.dtype() == DType::F32 || acc.dtype() == DType::F64))
      ops::accumulate_(acc, g);
    else
      ops::binary_(ops::BinaryOp::Add, acc, ops::to(g, acc.device(), acc.dtype()));
  }
}

std::uint64_t AccumulateGrad::add_hook(Hook hook) {
  KILN_CHECK(hook != nullptr, "register_grad_ready_hook: the hook is empty");
  hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

void AccumulateGrad::remove_hook(std::uint64_t id) {
  std::erase_if(hooks_, [id](const auto& h) { return h.first == id; });
}

const Tensor& SavedTensor::get(const char* op) const {
  KILN_CHECK(!tensor_.defined() || tensor_.storage()->version() == version_,
             "{}: a tensor saved for the gradient ({}) was modified in place after it was saved (version {} -> {})", op,
             tensor_.describe(), version_, tensor_.storage()->version());
  return tensor_;
}

}  // namespace kiln::autograd
