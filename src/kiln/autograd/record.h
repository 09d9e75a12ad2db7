#pragma once
// Recording an op into the graph. A differentiable function computes its outputs with raw ops,
// then, if any input requires grad and grad mode is on, calls record() with a backward closure
// that captures what it saved. Example (relu):
//
//   Tensor y = ops::unary(UnaryOp::Relu, x);
//   if (needs_grad({x}))
//     record("ReluBackward", {x}, {&y}, [sx = SavedTensor(x)](const Grads& g) -> Grads {
//       return {ops::unary_backward(UnaryOp::Relu, g[0], sx.get("relu"), Tensor())};
//     });
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "kiln/autograd/node.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::autograd {

using Grads = std::vector<Tensor>;
using BackwardFn = std::function<Grads(const Grads& grad_outputs)>;

// One element of the braced input lists of needs_grad() and record(), `{a, b}`: a pointer, so
// building the list copies no Tensor (no atomic reference-count traffic on every op). A temporary
// in the list is fine: it lives until the end of the full expression, past the call.
class TensorRef {
 public:
  TensorRef(const Tensor& t) : tensor_(&t) {}  // implicit on purpose: {a, b} must convert
  const Tensor& get() const { return *tensor_; }

 private:
  const Tensor* tensor_;
};

// True when grad mode is on and any input requires grad.
bool needs_grad(std::initializer_list<TensorRef> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Makes `outputs` the outputs of a new node whose backward maps output gradients to input
// gradients (one per input, undefined where an input needs none). Undefined output gradients
// (outputs that did not reach the loss) arrive as undefined tensors.
void record(const char* name, std::initializer_list<TensorRef> inputs, std::initializer_list<Tensor*> outputs,
            BackwardFn backward);
void record(const char* name, const std::vector<Tensor>& inputs, std::initializer_list<Tensor*> outputs,
            BackwardFn backward);
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor*>& outputs,
            BackwardFn backward);

// While alive (thread-local, nestable), collects the tensors that require grad which
// differentiable functions receive while grad mode is off: activation recompute runs a function
// without recording its graph and learns so which parameters (leaves) it uses, and whether it
// uses a non-leaf tensor that requires grad without taking it as an input. Each tensor once, in
// order of first use.
class GradInputObserver {
 public:
  GradInputObserver();
  ~GradInputObserver();
  GradInputObserver(const GradInputObserver&) = delete;
  GradInputObserver& operator=(const GradInputObserver&) = delete;

  const std::vector<Tensor>& seen() const { return seen_; }
  void see(const Tensor& t);

 private:
  GradInputObserver* previous_;
  std::vector<Tensor> seen_;
};

// The AccumulateGrad node of a leaf that requires grad (created on first use); null otherwise.
std::shared_ptr<Node> grad_accumulator(const Tensor& leaf);

}  // namespace kiln::autograd
