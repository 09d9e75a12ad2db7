// The tensor- and sequence-parallel part of GptConfig: what must divide by the tensor-parallel size
// (Megatron's checks in megatron/training/arguments.py and the layers' divide() calls), and what is
// not implemented with it yet. Every refusal names the flags and the numbers.
#include "kiln/models/gpt_config.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

namespace {

// Expert parallelism: each rank of the expert-parallel group holds num_experts / size whole experts.
void validate_expert_parallel_config(const GptConfig& c) {
  const int ep = c.expert_model_parallel_size;
  KILN_CHECK(ep >= 1, "GPT config: --expert-model-parallel-size must be at least 1, got {}", ep);
  if (ep == 1) return;
  KILN_CHECK(c.num_experts > 0,
             "GPT config: --expert-model-parallel-size {} splits the experts of MoE layers over ranks: it needs "
             "--num-experts",
             ep);
  KILN_CHECK(c.num_experts % ep == 0,
             "GPT config: --num-experts ({}) must be divisible by --expert-model-parallel-size ({}): each rank holds "
             "num-experts / size whole experts",
             c.num_experts, ep);
}

}  // namespace

void validate_parallel_config(const GptConfig& c) {
  validate_expert_parallel_config(c);
  const int tp = c.tensor_model_parallel_size;
  KILN_CHECK(tp >= 1, "GPT config: --tensor-model-parallel-size must be at least 1, got {}", tp);
  KILN_CHECK(!c.sequence_parallel || tp > 1,
             "GPT config: --sequence-parallel splits the sequence over the tensor-parallel group: it needs "
             "--tensor-model-parallel-size above 1 (it is {})",
             tp);
  if (tp == 1) return;
  // Not split yet: refused before anything is built, rather than trained differently.
  KILN_CHECK(
      c.num_experts == 0,
      "GPT config: --num-experts ({}) with --tensor-model-parallel-size {} is not supported yet (the experts are "
      "not split over the tensor-parallel group); train MoE models with data parallelism only",
      c.num_experts, tp);
  KILN_CHECK(!c.multi_latent_attention,
             "GPT config: --multi-latent-attention with --tensor-model-parallel-size {} is not supported yet (MLA's "
             "low-rank projections are not split)",
             tp);
  KILN_CHECK(c.mtp_num_layers == 0,
             "GPT config: --mtp-num-layers ({}) with --tensor-model-parallel-size {} is not supported yet",
             c.mtp_num_layers, tp);
  KILN_CHECK(!c.fp8,
             "GPT config: --fp8-format with --tensor-model-parallel-size {} is not supported yet (the FP8 linears' "
             "scaling state is per whole tensor)",
             tp);
  KILN_CHECK(c.num_attention_heads % tp == 0,
             "GPT config: --num-attention-heads ({}) must be divisible by --tensor-model-parallel-size ({}): each "
             "rank holds whole heads",
             c.num_attention_heads, tp);
  KILN_CHECK(c.query_groups() % tp == 0,
             "GPT config: the query groups ({}, --num-query-groups or one per head) must be divisible by "
             "--tensor-model-parallel-size ({}): each rank holds whole key/value heads",
             c.query_groups(), tp);
  KILN_CHECK(c.ffn_hidden() % tp == 0,
             "GPT config: --ffn-hidden-size ({}) must be divisible by --tensor-model-parallel-size ({})",
             c.ffn_hidden(), tp);
  KILN_CHECK(c.padded_vocab_size() % tp == 0,
             "GPT config: the padded vocabulary ({}: the tokenizer's {} rounded up to a multiple of "
             "--make-vocab-size-divisible-by {}) must be divisible by --tensor-model-parallel-size ({}); pass a "
             "--make-vocab-size-divisible-by that is a multiple of {}",
             c.padded_vocab_size(), c.vocab_size, c.make_vocab_size_divisible_by, tp, tp);
  KILN_CHECK(!c.sequence_parallel || c.seq_length % tp == 0,
             "GPT config: with --sequence-parallel, --seq-length ({}) must be divisible by "
             "--tensor-model-parallel-size ({}): each rank holds an equal slice of the sequence",
             c.seq_length, tp);
}

}  // namespace kiln::models
