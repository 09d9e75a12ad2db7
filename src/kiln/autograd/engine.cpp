#include "kiln/autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/autograd/node.h"
#include "kiln/autograd/record.h"
#include "kiln/autograd/weight_grad_store.h"
#include "kiln/ops/elementwise.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::autograd {

namespace {

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

void accumulate(Tensor& slot, const Tensor& g) {
  if (!g.defined()) return;
  if (!slot.defined()) {
    slot = g;
  } else {
    slot = ops::binary(ops::BinaryOp::Add, slot, g);  // out of place: `slot` may alias a user tensor
  }
}

// grad(): the leaves whose gradients are returned, by accumulator node, and what was collected.
struct Capture {
  std::unordered_map<const Node*, std::size_t> index;
  std::vector<Tensor> grads;
  std::vector<Tensor>* other_leaves = nullptr;
};

void run_graph(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads, bool retain_graph,
               Capture* capture) {
  NoGradGuard no_grad;  // backward formulas are not themselves recorded
  // Only a backward that accumulates into .grad may add weight gradients there directly.
  AccumulatingBackwardScope accumulating(capture == nullptr);
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::vector<std::shared_ptr<Node>> keep_alive;

  // Count, for every reachable node, how many edges point at it.
  std::vector<Node*> stack;
  auto root_node = [](const Tensor& t) -> std::shared_ptr<Node> {
    return t.grad_fn() ? t.grad_fn() : grad_accumulator(t);
  };
  for (const auto& r : roots) {
    auto n = root_node(r);
    if (n && !dependencies.count(n.get())) {
      dependencies[n.get()] = 0;
      stack.push_back(n.get());
      keep_alive.push_back(n);
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges) {
      if (!e.fn) continue;
      auto [it, inserted] = dependencies.try_emplace(e.fn.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(e.fn.get());
    }
  }

  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  for (std::size_t i = 0; i < roots.size(); ++i) {
    auto n = root_node(roots[i]);
    KILN_CHECK(n, "backward: tensor {} does not require grad and has no grad_fn", roots[i].describe());
    auto& buf = buffers[n.get()];
    buf.resize(n->num_outputs());
    accumulate(buf[roots[i].impl()->output_nr], root_grads[i]);
  }
  for (const auto& r : roots) {
    Node* n = root_node(r).get();
    if (dependencies[n] == 0) {
      ready.push(n);
      dependencies[n] = -1;  // queued
    }
  }

  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffers[n]);
    buffers.erase(n);
    grads.resize(n->num_outputs());
    if (capture) {
      if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) {
        // A leaf: hand its summed gradient back instead of accumulating it.
        if (auto it = capture->index.find(acc); it != capture->index.end()) {
          capture->grads[it->second] = std::move(grads[0]);
        } else if (capture->other_leaves && grads[0].defined()) {
          capture->other_leaves->push_back(Tensor(acc->leaf()));
        }
        continue;
      }
    }
    for (auto& [index, weak] : n->retained_outputs) {
      if (auto impl = weak.lock(); impl && grads[index].defined()) {
        Tensor g = grads[index];
        impl->grad = impl->grad ? ops::binary(ops::BinaryOp::Add, Tensor(impl->grad), g).impl_ptr()
                                : g.detach().clone().impl_ptr();
      }
    }
    std::vector<Tensor> input_grads = n->apply(std::move(grads));
    if (!retain_graph) n->release_saved();
    for (std::size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.fn) continue;
      auto& buf = buffers[e.fn.get()];
      buf.resize(e.fn->num_outputs());
      if (i < input_grads.size()) accumulate(buf[e.input_nr], input_grads[i]);
      if (--dependencies[e.fn.get()] == 0) ready.push(e.fn.get());
    }
  }
}

}  // namespace

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads, bool retain_graph) {
  run_graph(roots, root_grads, retain_graph, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads,
                         const std::vector<Tensor>& inputs, bool retain_graph, std::vector<Tensor>* other_leaves) {
  KILN_CHECK(roots.size() == root_grads.size(), "autograd::grad: {} outputs but {} output gradients", roots.size(),
             root_grads.size());
  // Gradients are returned here, not accumulated: nothing is deferred into a weight-gradient store.
  WeightGradStoreScope no_deferral(nullptr);
  Capture capture;
  capture.grads.resize(inputs.size());
  capture.other_leaves = other_leaves;
  std::vector<std::shared_ptr<Node>> accumulators;  // alive while the graph runs
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    KILN_CHECK(x.defined() && x.is_leaf() && x.requires_grad(),
               "autograd::grad: input {} ({}) must be a leaf that requires grad", i,
               x.defined() ? x.describe() : "undefined");
    auto acc = grad_accumulator(x);
    KILN_CHECK(capture.index.emplace(acc.get(), i).second, "autograd::grad: input {} ({}) is listed twice", i,
               x.describe());
    accumulators.push_back(std::move(acc));
  }
  run_graph(roots, root_grads, retain_graph, &capture);
  return std::move(capture.grads);
}

}  // namespace kiln::autograd
