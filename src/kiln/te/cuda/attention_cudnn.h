#pragma once
// te::attention through cuDNN's fused flash attention (the engines TransformerEngine and
// PyTorch's cuDNN SDPA reach), built as a cuDNN backend graph the way cudnn-frontend's composite
// SDPA nodes lower it:
//   forward:  S = Q Kᵀ (float) · scale → [causal: GEN_INDEX row/col, row (+S-T) >= col, BINARY_SELECT
//             with -inf] → max, sub, exp, sum reductions → stats = max + log(sum) (saved) and
//             P = exp / sum (16-bit) → O = P V
//   backward: softmax_sum = rowsum(dO ∘ O); P = exp(S·scale [masked] - stats); dV = Pᵀ dO;
//             dS = (dO Vᵀ - softmax_sum) ∘ P · scale; dK = dSᵀ Q; dQ = dS K (float accumulator,
//             then converted); grouped-query heads through a head reduction of dK and dV.
//   dropout:  an RNG operation draws a Bernoulli(1 - p) mask M of the [B, Hq, T, S] probabilities
//             from cuDNN's Philox generator at the seed and offset read from device memory; forward
//             O = (P ∘ M / (1 - p)) V; backward dV = (P ∘ M / (1 - p))ᵀ dO and dS = (dP ∘ M -
//             softmax_sum (1 - p)) ∘ P / (1 - p) · scale: the same mask, regenerated.
// Kiln's [B, T, H, D] tensors enter as [B, H, T, D] strides (no copies). The stats tensor is
// [B, Hq, T] float32, the natural-log logsumexp of the scaled scores: Kiln's own lse layout, so
// either backward can consume either forward's lse.
//
// Finalized execution plans are cached per (device, direction, dtype, B, T, S, Hq, Hkv, D, causal,
// strides, dropout probability); the softmax scale and the dropout's seed and offset are read when
// the plan runs, not part of the key. A refusal is cached too.
// KILN_CUDNN_SDPA_DEBUG=1 prints every graph's operations and the engine chosen (or why none).
#include <initializer_list>
#include <optional>
#include <string>

#include "kiln/te/attention_params.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te::cuda {

enum class CudnnAttentionDirection { Forward, Backward };

// Why this call is outside what Kiln sends to cuDNN (dtype, head dim, alignment, a causal call
// with more queries than keys whose first rows see no key); empty when it may go to cuDNN.
// `all`: every tensor the direction reads or writes (each must be 16-byte aligned).
std::string cudnn_attention_ineligible(const Tensor& q, const AttentionParams& p,
                                       std::initializer_list<const Tensor*> all);

// Builds (once; cached) the plan of one direction for this call's sizes. Returns cuDNN's refusal
// (which graph, which step failed, cuDNN's message) or nullopt when a plan is ready. Building
// synchronises the device (plan finalization may compile a kernel).
std::optional<std::string> cudnn_attention_prepare(CudnnAttentionDirection direction, const Tensor& q,
                                                   const AttentionParams& p);

// Run the prepared plans on the current stream (the same contracts as the Kiln kernels: contiguous
// tensors, lse [B, Hq, T] float32, grad_k / grad_v written). Raise an error when the plan was refused.
void cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const AttentionParams& p);
void cudnn_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                              const Tensor& grad_v, const AttentionParams& p);

// Creates and finalizes every tensor and operation descriptor of one direction's graph for these
// sizes, and returns the graph's operation listing (what KILN_CUDNN_SDPA_DEBUG prints); raises
// the first descriptor cuDNN rejects, naming it and the attribute. Needs no handle and no GPU:
// the part of a plan build a machine without a GPU can check (the graph's finalization and the
// engine search need the device).
std::string cudnn_attention_describe(CudnnAttentionDirection direction, DType dtype, const AttentionParams& p);

// Plans built so far (both directions, refusals included): lets tests see the cache reused.
std::size_t cudnn_attention_plans_built();

}  // namespace kiln::te::cuda
