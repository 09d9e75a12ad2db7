#pragma once
// Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_ with norm_type 2).
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::optim {

// total = sqrt(sum over all grads of sum(g^2)) with one sum_of_squares kernel call per device;
// when total > max_norm every grad is scaled by max_norm / (total + 1e-6). Parameters without a
// gradient are skipped. Returns the total norm before clipping as a float32 scalar tensor on the
// first gradient's device (call .item() to log it; nothing synchronises with the host).
// With no gradients at all, returns 0.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

// The global L2 norm of the gradients without modifying them.
Tensor grad_norm(const std::vector<Tensor>& params);

// The two halves of clip_grad_norm_, for a norm that spans processes (a distributed optimizer's
// gradient shards, whose squares are summed over the ranks in between): the sum of squares of
// `tensors` (a f32 scalar on the first one's device; 0 for none), and scaling `tensors` in place by
// min(max_norm / (norm + 1e-6), 1).
Tensor sum_of_squares(const std::vector<Tensor>& tensors);
void clip_to_norm_(const std::vector<Tensor>& tensors, const Tensor& norm, double max_norm);

// What clip_to_norm_ scales by, min(max_norm / (norm + 1e-6), 1), as a float32 scalar on norm's
// device (nothing synchronises): for an optimizer that applies it as it reads the gradients
// (FlatAdam::set_grad_scale) instead of a pass over them.
Tensor clip_coefficient(const Tensor& norm, double max_norm);

// The gradients of `params` that have one, in order: the list grad_norm and clip_grad_norm_ sum.
std::vector<Tensor> gradients_of(const std::vector<Tensor>& params);

}  // namespace kiln::optim
