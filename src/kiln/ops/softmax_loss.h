#pragma once
// Raw softmax / log-softmax over the last dimension and the fused cross-entropy kernels.
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

// Over the last dimension (x made contiguous).
Tensor softmax_last(const Tensor& x, bool log);
Tensor softmax_last_backward(const Tensor& grad_y, const Tensor& y, bool log);

// logits [N, C], target int64 [N]. Returns {loss [N] (0 on ignored rows), lse [N] f32}.
std::pair<Tensor, Tensor> cross_entropy_rows(const Tensor& logits, const Tensor& target, std::int64_t ignore_index,
                                             double label_smoothing);
// grad_loss [N] (per-row gradient); returns grad_logits [N, C].
Tensor cross_entropy_rows_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target,
                                   const Tensor& lse, std::int64_t ignore_index, double label_smoothing);

}  // namespace kiln::ops
