#pragma once
// Causal self-attention over a sequence split across a context-parallel group (Megatron-core's
// context parallelism; TransformerEngine's attention with CP). Each rank holds its load-balanced
// part of q, k and v (context_parallel_layout.h: chunks r and 2C - 1 - r of 2C, concatenated),
// [B, T/C, H, D], and gets the attention of those queries over the whole sequence, [B, T/C, Hq, Dv],
// equal to one process's attention at those positions. Differentiable in q, k and v.
//
// P2P (ring attention, TE's AttnFuncWithCPAndKVP2P): C steps; at step i the rank holds the keys and
// values of rank (r - i) mod C and sends them on to rank r + 1 while it computes (batched
// send/recv: MPI for host tensors, NCCL for device tensors). The causal structure of the chunks
// decides each block: step 0 (its own keys) is causal; keys of an earlier rank (src < r) are seen
// whole by all of this rank's queries but only their first chunk is before them; keys of a later rank
// (src > r) are seen whole by the second chunk of queries only. Each block runs te::attention_forward,
// which returns the block's output and per-row log-sum-exp, and the partial outputs are merged by
// their log-sum-exps. The backward runs te::attention_backward per block with the merged output and
// log-sum-exp (FlashAttention's backward is exact per key block given them), the keys and values
// going around the ring again and their gradients travelling with them, back to their owner.
//
// A2A (Ulysses, TE's AttnFuncWithCPAndQKVOA2A): q, k and v go from sequence-sharded to
// head-sharded by an all-to-all ([B, T, Hq/C, D], the chunks put back in sequence order), attention
// runs over the whole sequence with the rank's heads (CoreOps::attention: causal, dropout and
// selective recompute as in one process), and the output goes back by the inverse all-to-all. The
// heads and key/value heads must divide by C.
#include <memory>

#include "kiln/dist/communicator.h"
#include "kiln/models/gpt_config.h"
#include "kiln/models/transformer_core_ops.h"
#include "kiln/nn/layers.h"

namespace kiln::models {

// Ring attention: causal, softmax_scale 0 -> 1 / sqrt(D). q [B, T/C, Hq, D], k [B, T/C, Hkv, D],
// v [B, T/C, Hkv, Dv] (Hkv divides Hq).
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const dist::Communicator& cp,
                      double softmax_scale = 0);

// Ulysses: the sequence-sharded x [B, T/C, H, D] -> head-sharded [B, T, H/C, D] (heads [r H/C,
// (r+1) H/C), the whole sequence in order), and back; each the other's transpose (differentiable).
Tensor context_parallel_sequence_to_heads(const Tensor& x, const dist::Communicator& cp);
Tensor context_parallel_heads_to_sequence(const Tensor& x, const dist::Communicator& cp);

// The attention of one layer under context parallelism: `type`'s algorithm over `cp`. `ops`,
// `dropout` and `recompute` are run_core_attention's (a2a runs it on the head-sharded tensors).
Tensor context_parallel_attention(CpCommType type, const CoreOps& ops, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const dist::Communicator& cp,
                                  const std::shared_ptr<nn::Dropout>& dropout, bool recompute,
                                  double softmax_scale = 0);

}  // namespace kiln::models
