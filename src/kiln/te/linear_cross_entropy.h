#pragma once
// The output layer and the vocabulary cross-entropy in one (Liger's / TransformerEngine's fused
// linear cross-entropy): logits are made chunk by chunk over the tokens, each chunk's loss and
// logit gradient come from one fused pass, and the chunk's contributions to the hidden and weight
// gradients are accumulated at once, so no [N, V] tensor (and no float32 logits on the GPU) ever
// exists. The gradients are computed in the forward whenever they are required; the backward
// only scales them by the incoming gradient.
#include <cstdint>

#include "kiln/tensor/tensor.h"

namespace kiln::te {

struct LinearCrossEntropyOptions {
  std::int64_t max_chunk_bytes = std::int64_t{256} << 20;  // bound on one chunk's logits
  std::int64_t ignore_index = -100;                        // labels equal to it count as masked (PyTorch's)
};

// hidden [N, H], weight [V, H] (one floating dtype and device), labels int64 [N] in [0, V) where
// the mask is non-zero, loss_mask [N] (any floating dtype, >= 0) or undefined (all ones).
// Returns sum(CE_i * mask_i) / sum(mask_i) as a scalar: float32 (float64 for float64 inputs).
// Differentiable in hidden and weight.
Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& labels, const Tensor& loss_mask);
Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& labels, const Tensor& loss_mask,
                            const LinearCrossEntropyOptions& options);

}  // namespace kiln::te
