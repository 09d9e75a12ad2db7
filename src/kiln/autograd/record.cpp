#include "kiln/autograd/record.h"

#include "kiln/autograd/engine.h"
#include "kiln/ops/copy.h"

namespace kiln::autograd {

namespace {

class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, int num_outputs, BackwardFn backward)
      : Node(name, num_outputs), backward_(std::move(backward)) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    KILN_CHECK(backward_,
               "{}: trying to run backward through the graph a second time (its saved tensors were "
               "freed); pass retain_graph=true to the first backward()",
               name());
    return backward_(grads);
  }
  void release_saved() override { backward_ = nullptr; }

 private:
  BackwardFn backward_;
};

}  // namespace

namespace {
thread_local GradInputObserver* t_observer = nullptr;
}  // namespace

GradInputObserver::GradInputObserver() : previous_(t_observer) { t_observer = this; }
GradInputObserver::~GradInputObserver() { t_observer = previous_; }

void GradInputObserver::see(const Tensor& t) {
  for (const Tensor& s : seen_)
    if (s.is_same(t)) return;
  seen_.push_back(t);
  if (previous_) previous_->see(t);  // an enclosing observer sees what the inner one sees
}

bool needs_grad(std::initializer_list<TensorRef> inputs) {
  if (!grad_enabled()) {
    if (t_observer)
      for (const auto& r : inputs)
        if (r.get().defined() && r.get().requires_grad()) t_observer->see(r.get());
    return false;
  }
  for (const auto& r : inputs)
    if (r.get().defined() && r.get().requires_grad()) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) {
    if (t_observer)
      for (const auto& t : inputs)
        if (t.defined() && t.requires_grad()) t_observer->see(t);
    return false;
  }
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  if (!leaf.requires_grad() || leaf.grad_fn()) return nullptr;
  auto existing = leaf.impl()->grad_accumulator.lock();
  if (existing) return existing;
  auto acc = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
  leaf.impl()->grad_accumulator = acc;
  return acc;
}

namespace {

const Tensor& tensor_of(const Tensor& t) { return t; }
const Tensor& tensor_of(TensorRef r) { return r.get(); }

// The one implementation behind the record() overloads, over any range of inputs and outputs, so
// that the braced-list forms build no intermediate vectors.
template <class Inputs, class Outputs>
void record_node(const char* name, const Inputs& inputs, const Outputs& outputs, BackwardFn&& backward) {
  auto node = std::make_shared<FunctionNode>(name, static_cast<int>(outputs.size()), std::move(backward));
  node->next_edges.reserve(inputs.size());
  for (const auto& item : inputs) {
    const Tensor& in = tensor_of(item);
    Edge e;
    if (in.defined() && in.requires_grad()) {
      if (in.grad_fn()) {
        e.fn = in.grad_fn();
        e.input_nr = in.impl()->output_nr;
      } else {
        e.fn = grad_accumulator(in);
      }
    }
    node->next_edges.push_back(std::move(e));
  }
  const int last = static_cast<int>(outputs.size()) - 1;
  int nr = 0;
  for (Tensor* out : outputs) {
    // Outputs are fresh tensors (or views with their own TensorImpl): attach them to the node.
    // The last one takes our reference (one atomic increment and decrement fewer).
    out->impl()->requires_grad = true;
    out->impl()->grad_fn = nr == last ? std::move(node) : node;
    out->impl()->output_nr = nr++;
  }
}

}  // namespace

void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor*>& outputs,
            BackwardFn backward) {
  record_node(name, inputs, outputs, std::move(backward));
}

void record(const char* name, const std::vector<Tensor>& inputs, std::initializer_list<Tensor*> outputs,
            BackwardFn backward) {
  record_node(name, inputs, outputs, std::move(backward));
}

void record(const char* name, std::initializer_list<TensorRef> inputs, std::initializer_list<Tensor*> outputs,
            BackwardFn backward) {
  record_node(name, inputs, outputs, std::move(backward));
}

}  // namespace kiln::autograd

namespace kiln {

Tensor& Tensor::requires_grad_(bool on) {
  KILN_CHECK(is_leaf() || on, "requires_grad_(false) on a non-leaf tensor {}: use detach()", describe());
  KILN_CHECK(!on || is_floating(dtype()), "requires_grad_: only floating-point tensors can require grad, got {}",
             describe());
  impl_->requires_grad = on;
  return *this;
}

void Tensor::retain_grad() {
  KILN_CHECK(requires_grad(), "retain_grad() on {} which does not require grad", describe());
  if (is_leaf()) return;  // leaves keep .grad anyway
  impl_->retains_grad = true;
  impl_->grad_fn->retained_outputs.emplace_back(impl_->output_nr, impl_);
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  KILN_CHECK(requires_grad(), "backward() on {} which does not require grad", describe());
  Tensor g = gradient;
  if (!g.defined()) {
    KILN_CHECK(numel() == 1, "backward(): a gradient is needed for the non-scalar {}", describe());
    g = Tensor::ones(shape(), dtype(), device());
  } else {
    KILN_CHECK(g.shape() == shape(), "backward(): gradient {} does not match {}", g.describe(), describe());
  }
  autograd::run_backward({*this}, {g}, retain_graph);
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), storage_offset()); }

}  // namespace kiln
