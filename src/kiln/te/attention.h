#pragma once
// Causal / non-causal flash attention with grouped-query heads, forward and backward, for the
// GPT/Llama layers (FlashAttention-2's algorithm: softmax computed online over key tiles, so no
// [T, S] score matrix is ever stored; the backward recomputes the probabilities from the per-row
// logsumexp saved by the forward). attention_forward / attention_backward are an op family of te/:
// their kernels (te/cpu/, te/cuda/) enter the kernel registry through register_attention_ops().
#include <string>

#include "kiln/ops/kernel_registry.h"
#include "kiln/te/attention_params.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te {

struct AttentionOptions {
  bool causal = true;
  double softmax_scale = 0;  // 0: 1 / sqrt(D)
  // Auto follows KILN_ATTENTION_IMPL (kiln|cudnn) when set, else prefers cuDNN on CUDA (see
  // AttentionImpl). Cudnn on a call cuDNN cannot take is an error naming why.
  AttentionImpl impl = AttentionImpl::Auto;
  // Attention dropout, fused: each softmax probability (b, h, i, j) is zeroed with probability
  // `dropout` and the kept ones scaled by 1 / (1 - dropout) (after the row's softmax: the lse is
  // unaffected), the mask a pure function of (dropout_seed, dropout_offset, b, h, i, j),
  // regenerated in the backward (never stored). The caller advances its offset by B Hq T S per
  // call. dropout_offset_counter, when defined, is an int64 scalar on q's device added to
  // dropout_offset when the kernel runs (the graph-safe counter of nn::Dropout; the kernels read,
  // never advance it). Which mask depends on the implementation:
  //  - Kiln's kernels (Auto's choice with dropout, on every device) draw Philox
  //    (attention_dropout.h): the mask nn::Dropout draws at that (seed, offset) for the
  //    [B, Hq, T, S] probabilities, bit for bit on every device, so the transformer_engine layers
  //    drop what the local ones drop;
  //  - cuDNN's fused attention, when asked for (impl Cudnn, KILN_ATTENTION_IMPL=cudnn; 16-bit
  //    calls, as TransformerEngine runs it), draws its own generator's mask at (seed, offset +
  //    counter): the same for the forward, the backward and a recompute, but not the CPU's. A
  //    forward on cuDNN has its backward on cuDNN too.
  double dropout = 0;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  Tensor dropout_offset_counter;
};

// q [B, T, Hq, D], k [B, S, Hkv, D] and v [B, S, Hkv, Dv] (Hkv divides Hq: query head h reads
// key/value head h / (Hq / Hkv); Dv may differ from D, as MLA's), one floating dtype and device ->
// out [B, T, Hq, Dv] in q's dtype. The scale defaults to 1 / sqrt(D). cuDNN takes Dv != D as it is;
// for Kiln's kernels, which take one head size, the smaller side is padded with zeros (exact:
// zero q/k channels add nothing to the scores, zero v channels give zero output columns).
// Causal masks are aligned bottom-right: query i sees keys j <= i + S - T (with a KV cache the T
// new queries are the last T positions of the S keys). A query that sees no key (T > S, causal)
// gets a zero output. Differentiable in q, k and v (the gradients of k and v sum the query heads
// of their group).
// Dropout (options.dropout > 0) is applied in the kernels (see AttentionOptions for whose mask).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options = {});

// The kernels. Every tensor is contiguous; q, k, v, out, grad_* share q's dtype; lse is [B, Hq, T]
// float32 (float64 for float64 inputs): the natural-log sum of exp(scores) of each query row
// (-inf for a row that sees no key). grad_k and grad_v are written, not accumulated into.
using AttentionForwardKernel = void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                    const Tensor& lse, const AttentionParams& p);
using AttentionBackwardKernel = void(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                                     const Tensor& grad_v, const AttentionParams& p);
inline constexpr const char* kAttentionForwardOp = "attention_forward";
inline constexpr const char* kAttentionBackwardOp = "attention_backward";

// Registers the family's kernels (CPU, and CUDA in a CUDA build) in `registry`.
void register_attention_ops(ops::KernelRegistry& registry);
struct AttentionOps {
  ops::KernelOp<AttentionForwardKernel> forward;
  ops::KernelOp<AttentionBackwardKernel> backward;
};
// The ops in the process-wide registry, registering the family there on the first call.
AttentionOps attention_ops();

// The raw forward and backward (no autograd record), for callers that run their own graph
// (activation recompute, benchmarks). attention_forward returns {out, lse}.
std::pair<Tensor, Tensor> attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const AttentionOptions& options = {});
// Returns {grad_q, grad_k, grad_v}; with dropout, `options` must carry the forward's dropout, seed and
// offset (and counter) so that the same mask is regenerated.
std::vector<Tensor> attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse, const AttentionOptions& options = {});

}  // namespace kiln::te
