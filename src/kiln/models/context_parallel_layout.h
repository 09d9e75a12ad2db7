#pragma once
// Megatron's causal load balance for context parallelism (megatron/core/utils.py
// get_batch_on_this_cp_rank): a sequence of T tokens is cut into 2 C equal chunks and rank r of the
// context-parallel group of C ranks holds chunks r and 2 C - 1 - r, in that order. Under a causal mask
// the late chunks attend to many more keys than the early ones; pairing chunk r with its mirror gives
// every rank the same work.
#include <cstdint>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::models {

// The global positions of rank `rank`'s tokens, in its local order: [r c, (r + 1) c) then
// [(2C - 1 - r) c, (2C - r) c), c = seq / (2 C). Throws when 2 C does not divide seq.
std::vector<std::int64_t> context_parallel_positions(std::int64_t seq, int cp_size, int cp_rank);

// Rank `rank`'s part of x along `dim` (the sequence): its two chunks, concatenated (differentiable:
// the gradient goes back to those positions, zeros elsewhere). cp_size 1: x itself.
Tensor context_parallel_slice(const Tensor& x, int cp_size, int cp_rank, std::int64_t dim = 1);

}  // namespace kiln::models
