// The tensor- and sequence-parallel part of GptConfig: what must divide by the tensor-parallel size
// (Megatron's checks in megatron/training/arguments.py and the layers' divide() calls), and what is
// not implemented with it yet. Every refusal names the flags and the numbers.
#include "kiln/models/gpt_config.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/fp8_tensor.h"

namespace kiln::models {

namespace {

// Expert parallelism: each rank of the expert-parallel group holds num_experts / size experts, whole
// or (expert tensor parallelism) a slice of each.
void validate_expert_parallel_config(const GptConfig& c) {
  const int ep = c.expert_model_parallel_size;
  KILN_CHECK(ep >= 1, "GPT config: --expert-model-parallel-size must be at least 1, got {}", ep);
  const int etp = c.expert_tensor_parallel_size;
  KILN_CHECK(etp >= 1, "GPT config: --expert-tensor-parallel-size must be at least 1, got {}", etp);
  if (etp > 1) {
    KILN_CHECK(c.num_experts > 0,
               "GPT config: --expert-tensor-parallel-size {} splits the experts of MoE layers over ranks: it needs "
               "--num-experts",
               etp);
    KILN_CHECK(c.moe_ffn_hidden() % etp == 0,
               "GPT config: the experts' hidden size ({}, --moe-ffn-hidden-size or --ffn-hidden-size) must be "
               "divisible by --expert-tensor-parallel-size ({}): each rank holds an equal slice of every expert",
               c.moe_ffn_hidden(), etp);
    // The FP8 experts' scaling state is per whole expert (moe_experts.h): not split yet.
    KILN_CHECK(!c.fp8, "GPT config: --fp8-format with --expert-tensor-parallel-size {} is not supported yet", etp);
  }
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
  // As Megatron: the overlap cuts the sequence-parallel collectives into chunks, so it needs them.
  KILN_CHECK(!c.tp_comm_overlap || c.sequence_parallel,
             "GPT config: --tp-comm-overlap overlaps the sequence-parallel all-gather / reduce-scatter with the "
             "GEMMs: it needs --sequence-parallel (and --tensor-model-parallel-size above 1)");
  KILN_CHECK(!c.tp_comm_overlap || !c.fp8,
             "GPT config: --tp-comm-overlap with --fp8-format is not supported yet (the FP8 linears cast their "
             "whole inputs): leave one of them out");
  if (tp == 1) return;
  // MoE under tensor parallelism: the experts stay whole (expert tensor parallelism 1), the router
  // is replicated and the shared expert is a tensor-parallel MLP. Without --sequence-parallel every
  // rank of the group routes the group's tokens; with it each rank routes its own slice of the
  // sequence (Megatron's layout).
  KILN_CHECK(c.num_experts == 0 || c.moe_shared_expert_intermediate_size % tp == 0,
             "GPT config: --moe-shared-expert-intermediate-size ({}) must be divisible by "
             "--tensor-model-parallel-size ({}): the shared expert is split like the dense MLP",
             c.moe_shared_expert_intermediate_size, tp);
  // Not split yet: refused before anything is built, rather than trained differently.
  // FP8 linears split over the group take the whole tensors' scales (amaxes reduced over it); the
  // experts' grouped GEMMs do not reduce theirs (under --sequence-parallel each rank routes its own tokens).
  KILN_CHECK(!c.fp8 || c.num_experts == 0,
             "GPT config: --fp8-format with --num-experts ({}) and --tensor-model-parallel-size {} is not supported "
             "yet (the experts' FP8 scaling state is not reduced over the tensor-parallel group)",
             c.num_experts, tp);
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

namespace kiln::models {

std::string_view to_string(CpCommType v) { return v == CpCommType::A2A ? "a2a" : "p2p"; }

CpCommType parse_cp_comm_type(std::string_view s) {
  if (s == "p2p") return CpCommType::P2P;
  if (s == "a2a") return CpCommType::A2A;
  KILN_FAIL("--cp-comm-type must be p2p or a2a, got '{}'", s);
}

void validate_context_parallel_config(const GptConfig& c) {
  const int cp = c.context_parallel_size, tp = c.tensor_model_parallel_size;
  KILN_CHECK(cp >= 1, "GPT config: --context-parallel-size must be at least 1, got {}", cp);
  if (cp == 1) return;
  // Megatron's causal load balance: the sequence is cut into 2 x CP chunks, rank r holding chunks r
  // and 2 CP - 1 - r.
  KILN_CHECK(c.seq_length % (2 * cp) == 0,
             "GPT config: --seq-length ({}) must be divisible by 2 x --context-parallel-size (2 x {} = {}): each "
             "rank holds two of {} equal chunks of the sequence",
             c.seq_length, cp, 2 * cp, 2 * cp);
  KILN_CHECK(!c.sequence_parallel || (c.seq_length / cp) % tp == 0,
             "GPT config: with --sequence-parallel and --context-parallel-size {}, each rank's {} tokens (--seq-length "
             "{} / {}) must be divisible by --tensor-model-parallel-size ({})",
             cp, c.seq_length / cp, c.seq_length, cp, tp);
  if (c.cp_comm_type == CpCommType::A2A) {
    const std::int64_t heads = c.num_attention_heads / tp, groups = c.query_groups() / tp;
    KILN_CHECK(heads % cp == 0 && groups % cp == 0,
               "GPT config: --cp-comm-type a2a gives each of --context-parallel-size {} ranks whole heads: the {} "
               "attention heads and {} query groups (--num-attention-heads {} and --num-query-groups {} over "
               "--tensor-model-parallel-size {}) must both be divisible by {}",
               cp, heads, groups, c.num_attention_heads, c.query_groups(), tp, cp);
  }
  // Not composed with context parallelism yet: refused before anything is built.
  KILN_CHECK(c.attention_dropout == 0,
             "GPT config: --attention-dropout ({}) with --context-parallel-size {} is not supported (the attention "
             "blocks' dropout masks would not be the one-process ones): pass --attention-dropout 0",
             c.attention_dropout, cp);
  // FP8: per-tensor scales come from amaxes reduced over the tensor x context parallel group (the
  // whole sequence's). Blockwise: the wgrad GEMM's columnwise casts tile the tokens by 128, so each of
  // a rank's sequence chunks must be whole tiles, aligned as in one process.
  KILN_CHECK(!c.fp8 || c.fp8_recipe.recipe != te::Fp8ScalingRecipe::Blockwise ||
                 (c.seq_length / (2 * cp)) % kFp8BlockSize == 0,
             "GPT config: --fp8-recipe blockwise with --context-parallel-size {} needs each of the 2 x {} sequence "
             "chunks (--seq-length {} / {} = {} tokens) to be a multiple of {} tokens: the 1x{} scaling tiles of the "
             "weight gradient's token dimension would straddle the chunks (use --fp8-recipe delayed or tensorwise, "
             "or a --seq-length that is a multiple of {})",
             cp, cp, c.seq_length, 2 * cp, c.seq_length / (2 * cp), kFp8BlockSize, kFp8BlockSize,
             2 * cp * kFp8BlockSize);
}

}  // namespace kiln::models
