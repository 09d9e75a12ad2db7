#include "kiln/models/transformer_linear.h"

#include <fmt/format.h>

#include "kiln/autograd/functions.h"
#include "kiln/models/tensor_parallel_mappings.h"
#include "kiln/models/tensor_parallel_overlap.h"
#include "kiln/runtime/error.h"
#include "kiln/te/fp8_weight_cache.h"

namespace kiln::models {

bool is_fp8_scaling_state(std::string_view name) {
  const auto leaf = name.substr(name.rfind('.') == std::string_view::npos ? 0 : name.rfind('.') + 1);
  return leaf.starts_with("fp8_") &&
         (leaf.ends_with("_amax_history") || leaf.ends_with("_scale") || leaf.ends_with("_scale_inv"));
}

void register_fp8_scaling_state(nn::Module& module, const std::string& name, std::int64_t history_len,
                                te::Fp8ScalingState& state) {
  state = te::Fp8ScalingState::fresh(history_len, Device::cpu());
  state.amax_history =
      module.register_buffer("fp8_" + name + "_amax_history", state.amax_history, true, /*keep_dtype=*/true);
  state.scale = module.register_buffer("fp8_" + name + "_scale", state.scale, true, /*keep_dtype=*/true);
  state.scale_inv = module.register_buffer("fp8_" + name + "_scale_inv", state.scale_inv, true, /*keep_dtype=*/true);
}

std::vector<te::Fp8PrimaryWeights::Linear> fp8_linear_weights(nn::Module& model) {
  std::vector<te::Fp8PrimaryWeights::Linear> out;
  for (const auto& [name, m] : model.named_modules())
    if (auto l = std::dynamic_pointer_cast<ParallelLinear>(m); l && l->is_fp8())
      out.push_back({l->weight, &l->fp8_state()});
  return out;
}

Tensor ParallelLinear::state_value(const std::string& name, const Tensor& stored) const {
  if (name == "weight" && fp8_state_.primary_weight) return te::fp8_primary_weight_value(*fp8_state_.primary_weight);
  return Module::state_value(name, stored);
}

void ParallelLinear::load_state_value(const std::string& name, const Tensor& stored, const Tensor& value) {
  if (name == "weight" && fp8_state_.primary_weight)
    te::fp8_primary_weight_quantize(*fp8_state_.primary_weight, value, *fp8_recipe_);
  else
    Module::load_state_value(name, stored, value);
}

ParallelLinear::ParallelLinear(ParallelLinearKind kind, std::int64_t in_features, std::int64_t out_features,
                               bool has_bias, const LayerContext& context, int blocks)
    : Module(kind == ParallelLinearKind::Column ? "ColumnParallelLinear" : "RowParallelLinear"),
      kind(kind),
      in_features(in_features),
      out_features(out_features),
      blocks(blocks) {
  if (const dist::Communicator* tp = context.tensor_parallel_group()) {
    tp_ = *tp;
    tensor_parallel_size = tp_->size();
    tensor_parallel_rank = tp_->rank();
    sequence_parallel = context.sequence_parallel;
    tp_comm_overlap = context.sequence_parallel && context.tp_comm_overlap;
  }
  KILN_CHECK(blocks >= 1 && (blocks == 1 || kind == ParallelLinearKind::Column) && out_features % blocks == 0,
             "{}: {} output blocks for {} outputs", type_name(), blocks, out_features);
  const std::int64_t tp = tensor_parallel_size;
  const bool column = kind == ParallelLinearKind::Column;
  const std::int64_t split = column ? out_features : in_features;
  KILN_CHECK(split % (tp * (column ? blocks : 1)) == 0,
             "{}: {} ({}) is not divisible by --tensor-model-parallel-size ({}){}", type_name(),
             column ? "the output size" : "the input size", split, tp,
             blocks > 1 ? fmt::format(" in each of its {} blocks", blocks) : std::string());
  weight = register_parameter("weight", column ? Tensor::zeros({out_features / tp, in_features})
                                               : Tensor::zeros({out_features, in_features / tp}));
  bias = register_parameter("bias", has_bias ? Tensor::zeros({column ? out_features / tp : out_features}) : Tensor());
  if (context.fp8 == nullptr) return;
  fp8_recipe_ = *context.fp8;
  check_fp8_shard(*fp8_recipe_, split / tp / (column ? blocks : 1));
  fp8_state_.weight_cache = std::make_shared<te::Fp8WeightCache>();
  // Per-tensor scales of the whole tensors: amaxes reduced over the tensor x context parallel group.
  if (const dist::Communicator* amax_group = context.fp8_amax_reduction_group()) fp8_state_.amax_group = *amax_group;
  if (fp8_recipe_->recipe != te::Fp8ScalingRecipe::Delayed) return;
  const std::int64_t len = fp8_recipe_->amax_history_len;
  auto add_state = [&](const std::string& name, te::Fp8ScalingState& s) {
    register_fp8_scaling_state(*this, name, len, s);
  };
  add_state("input", fp8_state_.input);
  add_state("weight", fp8_state_.weight);
  add_state("grad_output", fp8_state_.grad_output);
}

void ParallelLinear::check_fp8_shard(const te::Fp8Recipe& recipe, std::int64_t shard) const {
  if (tensor_parallel_size == 1) return;
  const bool column = kind == ParallelLinearKind::Column;
  const char* what = column ? "output rows" : "input columns";
  // The GEMM's own rule, on this rank's part of the layer.
  KILN_CHECK(shard % 16 == 0,
             "{}: --fp8-format with --tensor-model-parallel-size {} gives each rank {} {} of this layer's {}{}, not a "
             "multiple of 16 (FP8 GEMMs): pick sizes whose per-rank parts are multiples of 16",
             type_name(), tensor_parallel_size, shard, what, column ? out_features : in_features,
             blocks > 1 ? fmt::format(" (per each of its {} blocks)", blocks) : std::string());
  // Blockwise scales are per 128-wide block of the split dimension (W's 128x128 blocks, the 1x128
  // tiles of the row layer's input and of the column layer's output gradient): a block straddling
  // two ranks' parts would be scaled differently from the one-process block.
  KILN_CHECK(recipe.recipe != te::Fp8ScalingRecipe::Blockwise || shard % kFp8BlockSize == 0,
             "{}: --fp8-recipe blockwise with --tensor-model-parallel-size {} gives each rank {} {} of this layer's "
             "{}{}, not a multiple of {}: its 128-wide scaling blocks would straddle the ranks' parts (pick sizes "
             "whose per-rank parts are multiples of {}, or --fp8-recipe delayed or tensorwise)",
             type_name(), tensor_parallel_size, shard, what, column ? out_features : in_features,
             blocks > 1 ? fmt::format(" (per each of its {} blocks)", blocks) : std::string(), kFp8BlockSize,
             kFp8BlockSize);
}

Tensor ParallelLinear::parallel_input(const Tensor& x) const {
  if (!tp_ || kind == ParallelLinearKind::Row) return x;
  return sequence_parallel ? gather_from_sequence_parallel_region(x, *tp_) : copy_to_tensor_parallel_region(x, *tp_);
}

Tensor ParallelLinear::local_linear(const Tensor& x, const Tensor& b) {
  return fp8_recipe_ ? te::fp8_linear(x, weight, b, *fp8_recipe_, &fp8_state_) : linear(x, weight, b);
}

Tensor ParallelLinear::forward(const Tensor& x) {
  if (!tp_) return local_linear(x, bias);
  // --tp-comm-overlap: the sequence gather / reduce-scatter cut into chunks under the GEMMs
  // (tensor_parallel_overlap.h); GptConfig refuses it with FP8.
  const bool overlapped = tp_comm_overlap && !fp8_recipe_;
  if (kind == ParallelLinearKind::Column) {
    Tensor y = overlapped ? sequence_parallel_column_linear_overlapped(x, weight, bias, *tp_)
                          : local_linear(parallel_input(x), bias);
    return gather_output ? gather_from_tensor_parallel_region(y, *tp_) : y;
  }
  Tensor y;
  if (overlapped) {
    y = sequence_parallel_row_linear_overlapped(x, weight, *tp_);
  } else {
    const Tensor partial = local_linear(x, Tensor());
    y = sequence_parallel ? reduce_scatter_to_sequence_parallel_region(partial, *tp_)
                          : reduce_from_tensor_parallel_region(partial, *tp_);
  }
  return bias.defined() ? add(y, bias) : y;
}

Tensor ParallelLinear::forward(const Tensor& x, const Fp8Tensor& x_cast) {
  KILN_CHECK(takes_fp8_input(), "{}: an FP8 input cast needs the delayed FP8 recipe", type_name());
  // The producer's cast replaces the whole input, so there is no room for copy_to / the sequence
  // gather / the reduction of the tensor-parallel layers (TransformerLayer does not fuse under TP).
  KILN_CHECK(!tp_, "{}: an FP8 input cast made by its producer needs a tensor-parallel group of one rank", type_name());
  return te::fp8_linear(x, weight, bias, *fp8_recipe_, &fp8_state_, x_cast);
}

TensorParallelSplit ParallelLinear::weight_split() const {
  if (kind == ParallelLinearKind::Column) return {.dim = 0, .blocks = blocks};
  return {.dim = 1};
}

TensorParallelSplit ParallelLinear::bias_split() const {
  if (kind == ParallelLinearKind::Column) return {.dim = 0, .blocks = blocks};
  // Added after the reduction: whole on every rank; under sequence parallelism to this rank's
  // slice of the sequence only, so its gradient is summed over the group.
  return {.sequence_parallel = sequence_parallel};
}

std::string ParallelLinear::extra_repr() const {
  return fmt::format(
      "in_features={}, out_features={}, bias={}{}{}", in_features, out_features, bias.defined() ? "True" : "False",
      tensor_parallel_size > 1 ? fmt::format(", tensor_parallel_size={}", tensor_parallel_size) : "",
      fp8_recipe_ ? fmt::format(", fp8={}/{}", te::to_string(fp8_recipe_->format), te::to_string(fp8_recipe_->recipe))
                  : "");
}

}  // namespace kiln::models
