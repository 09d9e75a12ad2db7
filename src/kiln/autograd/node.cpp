#include "kiln/autograd/node.h"

#include <atomic>

#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"

namespace kiln::autograd {

namespace {
std::atomic<std::uint64_t> g_next_sequence_nr{0};
}

Node::Node(std::string name, int num_outputs)
    : name_(std::move(name)), num_outputs_(num_outputs), sequence_nr_(g_next_sequence_nr++) {}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : Node("AccumulateGrad", 1), leaf_(std::move(leaf)) {}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor& g = grads[0];
  if (!g.defined()) return {};
  KILN_CHECK(g.shape() == leaf_->shape, "gradient of shape {} for a leaf of shape {}", shape_str(g.shape()),
             shape_str(leaf_->shape));
  if (!leaf_->grad) {
    // Keep the incoming buffer when nothing else refers to it; otherwise copy, so that later
    // accumulation cannot write into a tensor the user holds.
    Tensor owned = g.impl_ptr().use_count() == 1 && g.is_contiguous() ? g : ops::contiguous(g.detach().clone());
    leaf_->grad = owned.impl_ptr();
  } else {
    Tensor acc(leaf_->grad);
    ops::binary_(ops::BinaryOp::Add, acc, g);
  }
  return {};
}

const Tensor& SavedTensor::get(const char* op) const {
  KILN_CHECK(!tensor_.defined() || tensor_.storage()->version() == version_,
             "{}: a tensor saved for the gradient ({}) was modified in place after it was saved (version {} -> {})", op,
             tensor_.describe(), version_, tensor_.storage()->version());
  return tensor_;
}

}  // namespace kiln::autograd
