#pragma once
// te/'s mixture-of-experts op family in the kernel registry (ops/kernel_registry.h): the router's
// fused score + top-k, the dispatch plan (which token goes to which row of the expert-major
// buffer, with capacity dropping and padding), the permute / unpermute gathers and the grouped
// GEMM of the experts. CPU kernels in te/cpu/moe.cpp, CUDA kernels in te/cuda/moe.cu; the
// differentiable functions over them are te/moe.h's. Every tensor a kernel gets is contiguous;
// optional ones may be undefined.
//
// Layout shared by the kernels: N tokens, E experts, k = top-k. The routed slots are
// indices [N, k] (int64, the experts, distinct per token) with probs [N, k] (f32). The expert-major
// buffer has R rows: rows offsets[e] .. offsets[e + 1] are expert e's (its kept tokens in token
// order, then padding rows), rows offsets[E] .. R are unused. src_token [R] (int64) is the token of
// each row (-1: a padding or unused row, which reads as zeros); row_of [N, k] (int64) the row of
// each slot (-1: dropped).
#include <cstdint>

#include "kiln/ops/kernel_registry.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te {

enum class RouterScore : std::int32_t { Softmax = 0, Sigmoid = 1 };

// Megatron-core's topk_softmax_with_capacity (without the capacity part, which is the plan's):
//   softmax, pre_softmax:  scores = softmax(logits); top-k of scores; probs = the top-k scores
//   softmax, otherwise:    top-k of logits; probs = softmax over the k selected logits
//   sigmoid:               scores = sigmoid(logits); top-k of scores + expert_bias (bias only
//                          chooses); probs = selected scores / (their sum + 1e-20) when k > 1
// then probs *= scaling_factor (when not 0). With num_groups > 0 the top-k is group-limited
// (DeepSeek's device-limited routing, Megatron's group_limited_topk): the E experts form
// num_groups groups of E / num_groups, a group's score is the sum of its top (k / group_topk)
// selection scores, the top group_topk groups are kept and the top-k is taken inside them.
// Equal scores go to the lower expert index.
struct RouterTopkParams {
  RouterScore score = RouterScore::Softmax;
  bool pre_softmax = false;
  std::int64_t topk = 1;
  std::int64_t num_groups = 0;  // 0: no group limit
  std::int64_t group_topk = 0;
  double scaling_factor = 0;  // 0: none
};

// logits [N, E] f32 (f64 too on the CPU); expert_bias [E] (sigmoid only; may be undefined) and
// probs [N, k] of the logits' dtype; indices [N, k] int64.
using RouterTopkForwardKernel = void(const Tensor& logits, const Tensor& expert_bias, const RouterTopkParams& p,
                                     const Tensor& probs, const Tensor& indices);
// dlogits [N, E] from dprobs [N, k] (the logits' dtype); probs as the forward wrote them.
using RouterTopkBackwardKernel = void(const Tensor& dprobs, const Tensor& logits, const Tensor& indices,
                                      const Tensor& probs, const RouterTopkParams& p, const Tensor& dlogits);

// capacity: rows per expert (<= 0: no limit, nothing dropped). When an expert is routed more than
// `capacity` tokens, it keeps the `capacity` of highest prob (drop_by_position false; equal probs:
// the earlier token) or the first `capacity` in token order (true), Megatron's
// --moe-token-drop-policy probs / position. pad: every expert gets exactly `capacity` rows (padding
// rows after its tokens). Writes src_token [R], row_of [N, k], offsets [E + 1], and per expert
// tokens [E] (slots routed to it, before dropping) and dropped [E] (int64 each).
using MoeDispatchPlanKernel = void(const Tensor& indices, const Tensor& probs, std::int64_t capacity, bool pad,
                                   bool drop_by_position, const Tensor& src_token, const Tensor& row_of,
                                   const Tensor& offsets, const Tensor& tokens, const Tensor& dropped);
// out [R, H] = x[src_token] (zeros where src_token is -1).
using MoePermuteKernel = void(const Tensor& x, const Tensor& src_token, const Tensor& out);
// out [N, H]: out[n] = sum over slots j with row_of[n, j] >= 0 of probs[n, j] * in[row_of[n, j]]
// (probs f32, or f64 with f64 data on the CPU; undefined: weight 1, then this is also the
// permute's backward).
using MoeUnpermuteKernel = void(const Tensor& in, const Tensor& row_of, const Tensor& probs, const Tensor& out);
// The backward of the weighted unpermute for dout [N, H]: din [R, H] (rows no slot owns: 0),
// din[row_of[n, j]] = probs[n, j] * dout[n]; dprobs [N, k] (probs' dtype) = <in[row_of[n, j]], dout[n]>
// (0 for dropped slots; may be undefined).
using MoeUnpermuteBackwardKernel = void(const Tensor& dout, const Tensor& in, const Tensor& row_of, const Tensor& probs,
                                        const Tensor& din, const Tensor& dprobs);
// The experts' GEMM over the expert-major rows: for rows r of expert e,
//   trans_w false: w [E, O, K], y[r] = w[e] x[r]     (x [R, K] -> y [R, O]; the forward)
//   trans_w true:  w [E, K, O], y[r] = w[e]^T x[r]   (x [R, K] -> y [R, O]; the data gradient)
// rows beyond offsets[E] get 0.
using GroupedGemmKernel = void(const Tensor& x, const Tensor& w, const Tensor& offsets, bool trans_w, const Tensor& y);
// dw [E, O, K]: dw[e] = sum over rows r of expert e of dy[r] x[r]^T (0 for an expert without rows).
using GroupedGemmWgradKernel = void(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dw);

inline constexpr const char* kRouterTopkForwardOp = "te_moe_router_topk_forward";
inline constexpr const char* kRouterTopkBackwardOp = "te_moe_router_topk_backward";
inline constexpr const char* kMoeDispatchPlanOp = "te_moe_dispatch_plan";
inline constexpr const char* kMoePermuteOp = "te_moe_permute";
inline constexpr const char* kMoeUnpermuteOp = "te_moe_unpermute";
inline constexpr const char* kMoeUnpermuteBackwardOp = "te_moe_unpermute_backward";
inline constexpr const char* kGroupedGemmOp = "te_grouped_gemm";
inline constexpr const char* kGroupedGemmWgradOp = "te_grouped_gemm_wgrad";

struct MoeOps {
  ops::KernelOp<RouterTopkForwardKernel> router_topk_forward;
  ops::KernelOp<RouterTopkBackwardKernel> router_topk_backward;
  ops::KernelOp<MoeDispatchPlanKernel> dispatch_plan;
  ops::KernelOp<MoePermuteKernel> permute;
  ops::KernelOp<MoeUnpermuteKernel> unpermute;
  ops::KernelOp<MoeUnpermuteBackwardKernel> unpermute_backward;
  ops::KernelOp<GroupedGemmKernel> grouped_gemm;
  ops::KernelOp<GroupedGemmWgradKernel> grouped_gemm_wgrad;
};

// Registers the family's kernels (CPU, and CUDA in a CUDA build) in `registry`.
void register_moe_ops(ops::KernelRegistry& registry);
// The ops in the process-wide registry, registering the family there on first use.
const MoeOps& moe_ops();

namespace cpu {
RouterTopkForwardKernel router_topk_forward;
RouterTopkBackwardKernel router_topk_backward;
MoeDispatchPlanKernel moe_dispatch_plan;
MoePermuteKernel moe_permute;
MoeUnpermuteKernel moe_unpermute;
MoeUnpermuteBackwardKernel moe_unpermute_backward;
GroupedGemmKernel grouped_gemm;
GroupedGemmWgradKernel grouped_gemm_wgrad;
}  // namespace cpu
#if KILN_WITH_CUDA
namespace cuda {
RouterTopkForwardKernel router_topk_forward;
RouterTopkBackwardKernel router_topk_backward;
MoeDispatchPlanKernel moe_dispatch_plan;
MoePermuteKernel moe_permute;
MoeUnpermuteKernel moe_unpermute;
MoeUnpermuteBackwardKernel moe_unpermute_backward;
GroupedGemmKernel grouped_gemm;
GroupedGemmWgradKernel grouped_gemm_wgrad;
}  // namespace cuda
#endif

}  // namespace kiln::te
