#pragma once
// The backward engine: runs the graph below `roots` in reverse creation order, summing the
// gradients that reach each node before running it.
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::autograd {

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads, bool retain_graph);

// The gradients of `roots` (seeded with `root_grads`) with respect to `inputs`, which must be
// leaves that require grad, returned instead of accumulated (torch.autograd.grad): no .grad
// changes and no grad-ready hooks. An input that the graph does not reach gets an undefined
// gradient. Gradients reaching other leaves are dropped; when `other_leaves` is given, those
// leaves are listed there. Activation recompute (checkpoint.h) runs its inner backward so.
std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads,
                         const std::vector<Tensor>& inputs, bool retain_graph = false,
                         std::vector<Tensor>* other_leaves = nullptr);

}  // namespace kiln::autograd
