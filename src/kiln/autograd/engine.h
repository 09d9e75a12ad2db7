#pragma once
// The backward engine: runs the graph below `roots` in reverse creation order, summing the
// gradients that reach each node before running it.
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::autograd {

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads, bool retain_graph);

}  // namespace kiln::autograd
