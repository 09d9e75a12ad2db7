#pragma once
// The vocabulary split over the tensor-parallel group (Megatron-core's VocabParallelEmbedding and
// vocab_parallel_cross_entropy): rank r of tp holds the rows [r V/tp, (r+1) V/tp) of the embedding
// table and of the output layer, so neither the table nor the logits exist whole anywhere.
//
//   embedding: each rank looks up the tokens in its rows (zeros for tokens outside them) and the
//              partial embeddings are summed over the group (reduce_from_tensor_parallel_region).
//   cross-entropy: from each rank's logits [N, V/tp] for its vocabulary range, the log-sum-exp is
//              assembled from the group's maximum and the sum of the ranks' exp-sums, and the
//              label's logit from the one rank that holds it; the gradient of each rank's logits is
//              its part of softmax - one-hot. Every rank gets the same mean loss over the N tokens.
//
// Composed of differentiable functions and the tensor-parallel mappings (tensor_parallel_mappings.h),
// so autograd gives the backward. With a group of one rank both are the plain embedding and
// cross-entropy. Labels are read on the host (one device-to-host copy of N integers per call).
#include <cstdint>

#include "kiln/dist/communicator.h"
#include "kiln/tensor/tensor.h"

namespace kiln::models {

// The first vocabulary row rank `rank` of `ranks` holds; `vocab` must divide evenly.
std::int64_t vocab_range_start(std::int64_t vocab, int rank, int ranks);

// local_weight: [V/tp, H], this rank's rows; tokens: int64 of any shape -> [..., H] on every rank.
Tensor vocab_parallel_embedding(const Tensor& local_weight, const Tensor& tokens, std::int64_t vocab,
                                const dist::Communicator& tp);

// The same before the sum over the group: this rank's rows' part of the embeddings (zeros for the
// tokens other ranks hold). Sequence parallelism reduce-scatters it along the sequence instead.
Tensor vocab_parallel_embedding_partial(const Tensor& local_weight, const Tensor& tokens, std::int64_t vocab,
                                        const dist::Communicator& tp);

// Per token: the cross-entropy of each of the N rows, [N] f32, on every rank.
Tensor vocab_parallel_cross_entropy_per_token(const Tensor& local_logits, const Tensor& labels, std::int64_t vocab,
                                              const dist::Communicator& tp);

// local_logits: [N, V/tp] (f32), labels: [N] int64 in [0, vocab) -> the mean cross-entropy (a scalar).
Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& labels, std::int64_t vocab,
                                    const dist::Communicator& tp);

}  // namespace kiln::models
