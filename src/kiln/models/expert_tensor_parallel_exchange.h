#pragma once
// Expert tensor parallelism's movement of the routed rows (Megatron-core's MoEAlltoAllTokenDispatcher
// with an expert-tensor-parallel group above one rank): the ranks of an expert-tensor-parallel group
// hold the same experts, each a slice of every expert's hidden size F. After the token dispatcher
// has brought each rank its rows (expert-major), gather() gives every rank of the group all the
// group's rows, expert-major again ([local expert][group rank][that rank's rows]), so each rank runs
// its slice of every expert on every row; linear_fc2's partial sums then go back through scatter(),
// which sums each row's partials over the group and returns a rank its own rows (the reduce-scatter).
// Both are all-to-alls of whole rows (expert_parallel_mappings.h), so the backward of each is the
// other's forward: the gradients of the gathered rows are summed onto their owners.
#include <cstdint>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/models/token_dispatcher.h"

namespace kiln::models {

class ExpertTensorParallelExchange {
 public:
  explicit ExpertTensorParallelExchange(const dist::Communicator& group);

  // This rank's dispatched rows ([R, H], offsets [E_local + 1]; rows past offsets[E_local] unused)
  // -> the group's rows of the same experts, expert-major.
  DispatchedTokens gather(const DispatchedTokens& rows);
  // The experts' partial outputs for the rows of the last gather() -> this rank's rows [R, H], each
  // the sum over the group (the unused rows zero).
  Tensor scatter(const Tensor& partial);

 private:
  dist::Communicator group_;
  // Of the last gather: this rank's used rows and all its rows, the used rows of each group rank,
  // and the group-rank-major <-> expert-major orders of the gathered rows.
  std::int64_t used_rows_ = 0, all_rows_ = 0;
  std::vector<std::int64_t> used_of_rank_;
  Tensor to_expert_major_, to_rank_major_;
};

}  // namespace kiln::models
