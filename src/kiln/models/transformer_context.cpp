#include "kiln/models/transformer_context.h"

#include "kiln/runtime/error.h"

namespace kiln::models {

int LayerContext::tensor_parallel_size() const {
  const int tp = groups != nullptr ? groups->tp().size() : 1;
  KILN_CHECK(tp == 1,
             "GPT layers: --tensor-model-parallel-size {} is not supported yet (the layers run with a "
             "tensor-parallel group of size 1)",
             tp);
  return tp;
}

}  // namespace kiln::models
