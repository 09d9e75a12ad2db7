#pragma once
// Per-tensor FP8 scaling of a tensor split over processes (TransformerEngine's amax reduction): the
// scale of a sharded weight, of a tensor-parallel layer's split activation or gradient, or of a
// context-parallel rank's part of the sequence must be that of the WHOLE logical tensor, so the
// amax each rank measures on its part is max-reduced over the group that splits the tensor (the
// "amax reduction group"; Kiln's models pass the tensor x context parallel group) before it becomes
// a scale. With identical amaxes every rank computes the one-process scale, so the casts quantise
// each element as one process would. Replicated tensors reduce to their own amax (harmless).
//  - delayed:    the amaxes the casts recorded into their histories' entry 0 are reduced in one
//                all-reduce for every state about to be updated (Fp8UpdateGroup::flush, or the
//                unbatched update), before the update turns them into scales.
//  - tensorwise: the current scale is computed from the reduced amax before the cast (one small
//                all-reduce per cast, as TE's current scaling with amax reduction).
// Blockwise scales need none: each block's scale is its own, as long as no block straddles shards
// (the layers check that).
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/ops/fp8.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te {

// Collective over `group`: the entry 0 (the last recorded amax) of every state's history becomes its
// maximum over the group, in one all-reduce. Every rank passes its states in the same order.
void reduce_recorded_amaxes(const std::vector<ops::Fp8DelayedScalingRef>& states, const dist::Communicator& group);

// Collective over `group`: current scaling's scale for a cast of `x` (2-D) into `fp8_dtype`, f32 [1]
// on x's device, computed from amax(|x|) reduced over the group with the cast's own arithmetic
// (ops::fp8::scale_from_amax), so that a delayed-style cast with it gives the bytes a current-scaling
// cast of the whole tensor gives.
Tensor group_current_scale(const Tensor& x, DType fp8_dtype, const dist::Communicator& group);

}  // namespace kiln::te
