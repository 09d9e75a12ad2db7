#include "kiln/models/transformer_linear.h"

#include <fmt/format.h>

#include "kiln/autograd/functions.h"

namespace kiln::models {

ParallelLinear::ParallelLinear(ParallelLinearKind kind, std::int64_t in_features, std::int64_t out_features,
                               bool has_bias, const LayerContext& context)
    : Module(kind == ParallelLinearKind::Column ? "ColumnParallelLinear" : "RowParallelLinear"),
      kind(kind),
      in_features(in_features),
      out_features(out_features) {
  context.tensor_parallel_size();  // the place where a larger group splits out_features (Column) or in_features (Row)
  weight = register_parameter("weight", Tensor::zeros({out_features, in_features}));
  bias = register_parameter("bias", has_bias ? Tensor::zeros({out_features}) : Tensor());
}

Tensor ParallelLinear::forward(const Tensor& x) { return linear(x, weight, bias); }

std::string ParallelLinear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features, out_features,
                     bias.defined() ? "True" : "False");
}

}  // namespace kiln::models
