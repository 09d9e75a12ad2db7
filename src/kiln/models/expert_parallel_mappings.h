#pragma once
// The differentiable communication of expert parallelism (Megatron-core's moe/moe_utils and
// tensor_parallel/mappings.py all_to_all): rows of a [R, H] matrix moved between the ranks of the
// expert-parallel group. Its backward is the same exchange the other way round, so the gradient of
// each row returns to the rank the row came from.
//
//   all_to_all_rows: forward: rank r sends rows [sum(send_rows[:p]), + send_rows[p]) to rank p and
//   receives recv_rows[p] rows from rank p (in rank order); backward: the reverse all-to-all.
//   Rank a's send_rows[b] must equal rank b's recv_rows[a].
#include <cstdint>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/tensor/tensor.h"

namespace kiln::models {

Tensor all_to_all_rows(const Tensor& x, const std::vector<std::int64_t>& send_rows,
                       const std::vector<std::int64_t>& recv_rows, const dist::Communicator& group);

// Rows that arrive rank-major ([rank p][expert e], counts[p * experts + e] rows each, e.g. from an
// all-to-all) put in expert-major order ([e][p]) for the grouped GEMM, and back:
//   rows_expert_major = rows[order]; rows = rows_expert_major[inverse]; offsets [experts + 1]: where
//   each expert's rows start in the expert-major order.
struct ExpertMajorOrder {
  std::vector<std::int64_t> order, inverse, offsets;
};
ExpertMajorOrder expert_major_order(const std::vector<std::int64_t>& counts, int ranks, std::int64_t experts);

// Each expert's row count from a grouped GEMM's offsets [experts + 1] (on the host).
std::vector<std::int64_t> counts_from_offsets(const std::vector<std::int64_t>& offsets);

// An int64 index vector as a tensor on `device` (the orders above, for index_select).
Tensor index_tensor(const std::vector<std::int64_t>& v, Device device);

// x's rows in the order of `index` (a permutation); an empty x stays itself, so the graph through it
// (and the collectives of its backward) is kept on every rank.
Tensor reordered(const Tensor& x, const Tensor& index);

}  // namespace kiln::models
