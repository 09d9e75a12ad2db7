#pragma once
// LayerContext: what every transformer module receives besides its spec: the compute functions it
// runs with (CoreOps) and the process groups it is distributed over. This is where tensor (and
// sequence / context) parallelism enters: a layer splits its weights by groups->tp() and adds the
// collectives of Megatron's ColumnParallelLinear / RowParallelLinear. With no groups (one process)
// or every group of size 1 the layers run the single-GPU path. ParallelLinear splits over a larger
// tensor-parallel group (transformer_linear.h); the model as a whole does not yet, so GptModel and
// the embedding refuse larger groups through tensor_parallel_size().
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

  // The tensor-parallel group's size; throws for sizes the layers do not implement yet (> 1).
  int tensor_parallel_size() const;
};

}  // namespace kiln::models
