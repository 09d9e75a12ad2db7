#include "kiln/models/transformer_linear.h"

#include <fmt/format.h>

#include "kiln/autograd/functions.h"
#include "kiln/models/tensor_parallel_mappings.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

ParallelLinear::ParallelLinear(ParallelLinearKind kind, std::int64_t in_features, std::int64_t out_features,
                               bool has_bias, const LayerContext& context)
    : Module(kind == ParallelLinearKind::Column ? "ColumnParallelLinear" : "RowParallelLinear"),
      kind(kind),
      in_features(in_features),
      out_features(out_features) {
  if (context.groups != nullptr && context.groups->tp().size() > 1) {
    tp_ = context.groups->tp();
    tensor_parallel_size = tp_->size();
    tensor_parallel_rank = tp_->rank();
  }
  const std::int64_t tp = tensor_parallel_size;
  const bool column = kind == ParallelLinearKind::Column;
  const std::int64_t split = column ? out_features : in_features;
  KILN_CHECK(split % tp == 0, "{}: {} ({}) is not divisible by --tensor-model-parallel-size ({})", type_name(),
             column ? "the output size" : "the input size", split, tp);
  weight = register_parameter("weight", column ? Tensor::zeros({out_features / tp, in_features})
                                               : Tensor::zeros({out_features, in_features / tp}));
  bias = register_parameter("bias", has_bias ? Tensor::zeros({column ? out_features / tp : out_features}) : Tensor());
}

Tensor ParallelLinear::forward(const Tensor& x) {
  if (!tp_) return linear(x, weight, bias);
  if (kind == ParallelLinearKind::Column) {
    Tensor y = linear(copy_to_tensor_parallel_region(x, *tp_), weight, bias);
    return gather_output ? gather_from_tensor_parallel_region(y, *tp_) : y;
  }
  Tensor y = reduce_from_tensor_parallel_region(linear(x, weight), *tp_);
  return bias.defined() ? add(y, bias) : y;
}

std::string ParallelLinear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}{}", in_features, out_features,
                     bias.defined() ? "True" : "False",
                     tensor_parallel_size > 1 ? fmt::format(", tensor_parallel_size={}", tensor_parallel_size) : "");
}

}  // namespace kiln::models
