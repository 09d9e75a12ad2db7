#pragma once
// The mixture-of-experts ops as differentiable functions over te/moe_ops.h's kernels: the router's
// fused score + top-k, the dispatch plan, permute / unpermute between token order and the
// expert-major buffer, and the experts' grouped linear layer. Used by models/moe_*.
#include <cstdint>

#include "kiln/te/moe_ops.h"

namespace kiln::te {

struct RouterTopk {
  Tensor probs;    // [N, k] f32, differentiable in the logits
  Tensor indices;  // [N, k] int64
};

// logits [N, E] f32 (f64 on the CPU: the reference path; probs take the logits' dtype),
// differentiable; expert_bias [E] of the logits' dtype or undefined (sigmoid only: it chooses
// experts without weighting them).
RouterTopk router_topk(const Tensor& logits, const Tensor& expert_bias, const RouterTopkParams& params);

enum class TokenDropPolicy { Probs, Position };

// Where each routed slot goes in the expert-major buffer (see te/moe_ops.h); not differentiable.
struct DispatchPlan {
  std::int64_t num_tokens = 0, topk = 0, num_experts = 0, rows = 0;
  Tensor src_token;  // [rows] int64
  Tensor row_of;     // [N, k] int64
  Tensor offsets;    // [E + 1] int64, on the device
  Tensor tokens;     // [E] int64: slots routed to each expert (before dropping)
  Tensor dropped;    // [E] int64: slots dropped over capacity
};

// capacity <= 0: no limit. With a capacity the buffer has E * capacity rows when padding, else
// min(N k, E * capacity) (rows past offsets[E] unused, zeros); without, N k.
DispatchPlan dispatch_plan(const RouterTopk& routing, std::int64_t num_experts, std::int64_t capacity, bool pad,
                           TokenDropPolicy policy);

// x [N, H] -> [rows, H] (x[src_token], zeros for padding); differentiable in x.
Tensor moe_permute(const Tensor& x, const DispatchPlan& plan);
// in [rows, H] -> [N, H]: each token's rows summed, weighted by probs [N, k] f32 (f64 with f64
// rows; undefined: 1);
// differentiable in `in` and probs.
Tensor moe_unpermute(const Tensor& in, const DispatchPlan& plan, const Tensor& probs);
// x [rows, K], weight [E, O, K] -> [rows, O]: the rows of expert e times weight[e]^T (rows past
// offsets[E]: 0); differentiable in x and weight.
Tensor grouped_linear(const Tensor& x, const Tensor& weight, const Tensor& offsets);

}  // namespace kiln::te
