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

}  // namespace kiln::models
