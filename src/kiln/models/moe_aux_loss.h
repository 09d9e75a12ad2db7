#pragma once
// The router's auxiliary losses (Megatron-core's moe_utils) and how they reach the backward:
// attach_aux_loss() is Megatron's MoEAuxLossAutoScaler, an identity on an activation whose
// backward also gives the loss the gradient `scale` (set by the trainer to 1 / micro-batches, as
// the LM loss is scaled), so the aux losses train the router without being added to the LM loss
// the trainer logs.
#include <cstdint>

#include "kiln/dist/communicator.h"
#include "kiln/tensor/tensor.h"

namespace kiln::models {

// y = x; in the backward dL/d aux = moe_aux_loss_scale() x gradient_factor. (The factor: a
// context-parallel router's, whose gradients the trainer averages over the group; moe_router.h.)
Tensor attach_aux_loss(const Tensor& x, const Tensor& aux, double gradient_factor = 1.0);
void set_moe_aux_loss_scale(double scale);
double moe_aux_loss_scale();

// Megatron's compute_routing_scores_for_aux_loss: softmax(logits), or sigmoid(logits) normalised
// to sum 1 over the experts; [N, E] f32, differentiable.
Tensor routing_scores_for_aux_loss(const Tensor& logits, bool sigmoid);
// The top-k routing map of the aux loss (a plain top-k of the logits, without groups, bias or
// capacity), [N, E] f32 of 0/1, not differentiable.
Tensor aux_loss_routing_map(const Tensor& logits, std::int64_t topk);
// Switch/GShard load balancing as Megatron's switch_load_balancing_loss_func:
//   sum_e (sum_n scores[n, e]) * tokens[e] * E * coeff / (k * N * N), tokens = routing_map's column sums.
// With a `sequence_partition` group (sequence parallelism: each rank holds an equal slice of every
// sequence; Megatron's sequence_partition_group) the token counts are summed over the group and N is
// the group's tokens, while the scores stay this rank's: each rank's loss is its share of the
// group's, the shares add up to the one-process loss and each gives its own scores their gradient.
Tensor switch_aux_loss(const Tensor& scores, const Tensor& routing_map, std::int64_t topk, double coeff,
                       const dist::Communicator* sequence_partition = nullptr);
// The sequence-level variant (DeepSeek-V2/V3): the same per sequence of `seq_length` tokens (the
// tokens are [B, T] flattened b-major), averaged over the B sequences. With a `sequence_partition`
// group, `seq_length` is this rank's slice of each sequence and the per-sequence counts are summed
// over the group (its share of the group's loss, as above).
Tensor seq_aux_loss(const Tensor& scores, const Tensor& routing_map, std::int64_t topk, std::int64_t seq_length,
                    double coeff, const dist::Communicator* sequence_partition = nullptr);
// ST-MoE's router z-loss: mean over tokens of logsumexp(logits)^2, times coeff.
Tensor z_loss(const Tensor& logits, double coeff);

}  // namespace kiln::models
