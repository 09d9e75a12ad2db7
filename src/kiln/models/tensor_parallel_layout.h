#pragma once
// How each parameter of a tensor-parallel model is laid out over the tensor-parallel group, so that
// whole tensors can be cut into a rank's shard (initialisation, loading a checkpoint) and a rank's
// shard gathered back into the whole tensor (saving a checkpoint), and so that the gradient norm and
// sequence parallelism know which parameters every rank holds whole.
//
//   split dim d, blocks 1:  rank r of tp holds the r-th of tp equal slices of dimension d
//                           (column-parallel rows: dim 0; row-parallel columns: dim 1; the
//                           vocabulary rows of the embedding and output layer: dim 0);
//   split dim d, blocks k:  dimension d is k equal blocks side by side and rank r holds the r-th
//                           slice of each block, in block order (SwiGLU's linear_fc1: the gate's F
//                           rows, then the up projection's; a rank holds its gate rows, then its up rows);
//   replicated (dim -1):    every rank holds all of it (norms, row-parallel biases, position
//                           embeddings); with sequence_parallel its gradient on each rank covers that
//                           rank's slice of the sequence only and is summed over the group after
//                           backward (Megatron's allreduce of sequence-parallel gradients).
#include <cstdint>
#include <map>
#include <string>

#include "kiln/dist/communicator.h"
#include "kiln/tensor/tensor.h"

namespace kiln::models {

struct TensorParallelSplit {
  int dim = -1;  // -1: replicated
  int blocks = 1;
  bool sequence_parallel = false;  // replicated, gradient summed over the group (--sequence-parallel)

  bool replicated() const { return dim < 0; }
  bool operator==(const TensorParallelSplit&) const = default;
};

// Parameter (state_dict) name -> its split; names absent are replicated.
using TensorParallelLayout = std::map<std::string, TensorParallelSplit>;

// The split of `name` in `layout` (replicated when absent).
TensorParallelSplit split_of(const TensorParallelLayout& layout, const std::string& name);

// The whole shape of a shard of `local_shape` split over `ranks`.
Shape whole_shape(const Shape& local_shape, const TensorParallelSplit& split, int ranks);

// Rank `rank` of `ranks`'s shard of the whole tensor `whole` (a new contiguous tensor). Throws
// naming `what` when the split dimension does not divide.
Tensor shard_of(const Tensor& whole, const TensorParallelSplit& split, int rank, int ranks, const std::string& what);

// The whole tensor from every rank's shard, in rank order (the inverse of shard_of).
Tensor whole_from_shards(const std::vector<Tensor>& shards, const TensorParallelSplit& split);

// Collective over `tp`: the whole tensor from each rank's `local` shard, on every rank (a replicated
// tensor is returned as it is, uncopied).
Tensor gather_whole(const Tensor& local, const TensorParallelSplit& split, const dist::Communicator& tp);

}  // namespace kiln::models
