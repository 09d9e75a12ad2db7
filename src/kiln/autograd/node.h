#pragma once
// The autograd graph: a Node is the backward of one forward op. It receives the gradients of
// the op's outputs and returns the gradients of its inputs, which flow along next_edges.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> fn;  // null: the input needs no gradient
  int input_nr = 0;          // which of fn's gradient inputs this feeds
};

class Node {
 public:
  explicit Node(std::string name, int num_outputs);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // grads[i] is the gradient of forward output i (undefined if it did not reach the loss).
  // Returns one gradient per next_edges entry (undefined where not needed).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  // Frees saved tensors after a backward without retain_graph.
  virtual void release_saved() {}

  const std::string& name() const { return name_; }
  int num_outputs() const { return num_outputs_; }
  std::uint64_t sequence_nr() const { return sequence_nr_; }

  std::vector<Edge> next_edges;
  // Non-leaf outputs whose .grad the user asked to keep (Tensor::retain_grad).
  std::vector<std::pair<int, std::weak_ptr<TensorImpl>>> retained_outputs;

 protected:
  // A fixed place in the engine's order (AccumulateGrad: first whenever ready).
  Node(std::string name, int num_outputs, std::uint64_t sequence_nr);

 private:
  std::string name_;
  int num_outputs_;
  std::uint64_t sequence_nr_;  // creation order: later nodes run first in backward
};

// The sink for a leaf tensor: adds the incoming gradient to leaf.grad, in place when leaf.grad
// exists (converting the dtype when it differs: a bf16 parameter's gradient accumulates into an
// fp32 .grad, e.g. a view of a flat gradient buffer), then calls the leaf's grad-ready hooks.
// The engine runs it once per backward, after every contribution has been summed, so a hook
// sees the leaf's gradient for this backward complete (see grad_ready_hook.h). It has the
// highest sequence number, as in PyTorch: the engine runs it as soon as it is ready, so hooks
// fire while the rest of backward still runs (a bucket's reduction can start early).
class AccumulateGrad final : public Node {
 public:
  using Hook = std::function<void(const Tensor& leaf)>;

  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;

  std::uint64_t add_hook(Hook hook);
  void remove_hook(std::uint64_t id);
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }
  // A backward function added a contribution straight into leaf.grad (gradient-accumulation
  // fusion, grad_accumulation_fusion.h): the next apply() runs the hooks even when no gradient
  // reaches it through the graph.
  void note_accumulated_in_place() { accumulated_in_place_ = true; }

 private:
  void accumulate(const Tensor& g);  // g into leaf.grad (created when absent)

  std::shared_ptr<TensorImpl> leaf_;
  bool accumulated_in_place_ = false;
  std::vector<std::pair<std::uint64_t, Hook>> hooks_;
  std::uint64_t next_hook_id_ = 0;
};

// A tensor saved for backward, with the storage version at save time: a later in-place change
// is reported instead of silently producing wrong gradients.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t) : tensor_(t), version_(t.defined() ? t.storage()->version() : 0) {}
  const Tensor& get(const char* op) const;
  bool defined() const { return tensor_.defined(); }

 private:
  Tensor tensor_;
  std::uint64_t version_ = 0;
};

}  // namespace kiln::autograd
