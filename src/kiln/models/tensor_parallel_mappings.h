#pragma once
// The four differentiable communications of tensor parallelism (Megatron-core's
// tensor_parallel/mappings.py), over the tensor-parallel group; each is the other's transpose:
//
//   copy_to_tensor_parallel_region     forward: identity          backward: all-reduce (sum)
//   reduce_from_tensor_parallel_region forward: all-reduce (sum)  backward: identity
//   gather_from_tensor_parallel_region forward: all-gather, last dimension   backward: keep own part
//   scatter_to_tensor_parallel_region  forward: keep own part, last dimension backward: all-gather
//
// A column-parallel linear starts with copy_to (its input is replicated, its input gradient the sum
// of every rank's part); a row-parallel linear ends with reduce_from (each rank's partial product
// summed). "Own part": rank r of the group holds the r-th of group-size equal slices of the last
// dimension. With a group of one rank each returns its input.
//
// Sequence parallelism (Megatron's *_sequence_parallel_region) splits activations [B, T, ...] along
// the sequence, dimension 1 (Kiln is batch-first; Megatron's [T, B, H] splits dimension 0):
//
//   gather_from_sequence_parallel_region       forward: all-gather T       backward: reduce-scatter (sum)
//   reduce_scatter_to_sequence_parallel_region forward: reduce-scatter T   backward: all-gather
//   scatter_to_sequence_parallel_region        forward: keep own slice     backward: all-gather
//
// A column-parallel linear under sequence parallelism starts with the gather (in place of copy_to),
// a row-parallel one ends with the reduce-scatter (in place of reduce_from); the embedding's output
// is scattered. Rank r holds positions [r T/tp, (r+1) T/tp).
#include "kiln/dist/communicator.h"
#include "kiln/tensor/tensor.h"

namespace kiln::models {

Tensor copy_to_tensor_parallel_region(const Tensor& x, const dist::Communicator& tp);
Tensor reduce_from_tensor_parallel_region(const Tensor& x, const dist::Communicator& tp);
Tensor gather_from_tensor_parallel_region(const Tensor& x, const dist::Communicator& tp);
Tensor scatter_to_tensor_parallel_region(const Tensor& x, const dist::Communicator& tp);

Tensor gather_from_sequence_parallel_region(const Tensor& x, const dist::Communicator& tp);
Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, const dist::Communicator& tp);
Tensor scatter_to_sequence_parallel_region(const Tensor& x, const dist::Communicator& tp);

}  // namespace kiln::models
