#pragma once
// LayerContext: what every transformer module receives besides its spec: the compute functions it
// runs with (CoreOps) and the process groups it is distributed over. This is where tensor and
// sequence parallelism enter: a layer splits its weights by groups->tp() and adds the collectives
// of Megatron's ColumnParallelLinear / RowParallelLinear (transformer_linear.h), the embedding and
// output layer split the vocabulary (vocab_parallel.h), and with sequence_parallel the activations
// between them are split along the sequence (tensor_parallel_mappings.h). With no groups (one
// process) or a tensor-parallel group of one rank the layers run the single-GPU path.
#include "kiln/dist/process_groups.h"
#include "kiln/models/transformer_core_ops.h"
#include "kiln/te/fp8_recipe.h"

namespace kiln::models {

struct LayerContext {
  const CoreOps* ops = &local_core_ops();
  const dist::ProcessGroups* groups = nullptr;  // null: this process alone
  // Non-null: the layer's linears run in FP8 with this recipe (TransformerBlock sets it for the
  // layers GptConfig::is_fp8_layer names; it points into the model's config).
  const te::Fp8Recipe* fp8 = nullptr;
  // --sequence-parallel: the activations outside attention and the MLP are [B, T / tp, H] per rank.
  bool sequence_parallel = false;
  // --tp-comm-overlap: with sequence_parallel, the column / row linears overlap their sequence
  // all-gather / reduce-scatter with their GEMMs (tensor_parallel_overlap.h).
  bool tp_comm_overlap = false;
  // Context parallelism (groups->cp() of more than one rank): each rank holds its load-balanced part
  // of the sequence (context_parallel_layout.h) and self-attention runs this algorithm over the group
  // (context_parallel_attention.h); everything else is token-local.
  CpCommType cp_comm_type = CpCommType::P2P;

  int tensor_parallel_size() const { return groups != nullptr ? groups->tp().size() : 1; }
  int tensor_parallel_rank() const { return groups != nullptr ? groups->tp().rank() : 0; }
  // The tensor-parallel group when it has more than one rank, else null (the single-GPU path).
  const dist::Communicator* tensor_parallel_group() const {
    return tensor_parallel_size() > 1 ? &groups->tp() : nullptr;
  }
  // Expert parallelism: the MoE layers' experts split over groups->ep() (moe_experts.h,
  // token_dispatcher.h); size 1 without groups.
  int expert_parallel_size() const { return groups != nullptr ? groups->ep().size() : 1; }
  int expert_parallel_rank() const { return groups != nullptr ? groups->ep_rank() : 0; }
  // Expert tensor parallelism: each expert split over groups->expert_tp() (moe_experts.h,
  // expert_tensor_parallel_exchange.h); size 1 without groups.
  int expert_tensor_parallel_size() const { return groups != nullptr ? groups->expert_tp().size() : 1; }
  int expert_tensor_parallel_rank() const { return groups != nullptr ? groups->expert_tp().rank() : 0; }
  int context_parallel_size() const { return groups != nullptr ? groups->cp().size() : 1; }
  int context_parallel_rank() const { return groups != nullptr ? groups->cp().rank() : 0; }
  // The context-parallel group when it has more than one rank, else null.
  const dist::Communicator* context_parallel_group() const {
    return context_parallel_size() > 1 ? &groups->cp() : nullptr;
  }
  // FP8's amax reduction group (te/fp8_amax_reduction.h): the tensor x context parallel group, over
  // which a layer's weights (TP) and activations and gradients (TP, SP, CP) are split, when it has
  // more than one rank, else null. Replicated tensors reduce to their own amax, so one group serves all.
  const dist::Communicator* fp8_amax_reduction_group() const {
    return groups != nullptr && groups->tp_cp().size() > 1 ? &groups->tp_cp() : nullptr;
  }
};

}  // namespace kiln::models
