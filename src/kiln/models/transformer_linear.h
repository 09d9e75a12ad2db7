#pragma once
// The linear layers of a transformer, named as Megatron-core's: ColumnParallelLinear (linear_qkv,
// linear_fc1: output rows split over the tensor-parallel group) and RowParallelLinear (linear_proj,
// linear_fc2: input columns split, outputs all-reduced). With a tensor-parallel group of size 1
// (LayerContext) both are y = x W^T + b with W [out, in]. With a group of tp ranks, rank r holds
//   Column: W rows [r out/tp, (r+1) out/tp) and those of b; forward copy_to_tensor_parallel_region(x)
//           then x W_r^T + b_r: its slice of the output (all of it, all-gathered, with gather_output);
//   Row:    W columns [r in/tp, (r+1) in/tp) and all of b; the input is this rank's slice (a column-
//           parallel layer's output), forward reduce_from_tensor_parallel_region(x_r W_r^T) + b.
// (tensor_parallel_mappings.h; Megatron's layers.py.) With sequence parallelism (LayerContext::
// sequence_parallel) the column layer's input is [B, T/tp, H] and is all-gathered along the sequence
// in place of copy_to, and the row layer reduce-scatters along the sequence in place of the
// all-reduce (its output [B, T/tp, H], the bias added on the slice).
// `blocks` > 1 (column only): the output rows are that many equal blocks each split over the group
// (SwiGLU's linear_fc1: gate | up; rank r holds its gate rows, then its up rows).
// Parameters are created uninitialised: GptModel initialises them (whole, then sliced).
// With an FP8 recipe in the context the GEMMs run in FP8 (te::fp8_linear); the delayed recipe's
// scaling state is kept as float32 buffers (fp8_{input,weight,grad_output}_{amax_history,scale,
// scale_inv}) that stay float32 in a bf16 model and travel in checkpoints; the weight's FP8 casts are
// cached until the weight changes (te/fp8_weight_cache.h). Under tensor and context parallelism the
// per-tensor scales are the whole tensors' (amaxes max-reduced over the tensor x context parallel
// group, te/fp8_amax_reduction.h), so every rank holds the same scaling state, that of one process;
// blockwise scaling needs each rank's part of the split dimension to be whole 128-wide blocks.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/models/tensor_parallel_layout.h"
#include "kiln/models/transformer_context.h"
#include "kiln/nn/module.h"
#include "kiln/te/fp8_linear.h"
#include "kiln/te/fp8_primary_weights.h"
#include "kiln/te/fp8_update_group.h"

namespace kiln::models {

enum class ParallelLinearKind { Column, Row };

// Whether a state_dict name is an FP8 linear's delayed-scaling state (a checkpoint may lack it or
// carry it across FP8 / bf16 runs: it starts fresh or is dropped).
bool is_fp8_scaling_state(std::string_view name);

// Makes `state` a fresh delayed-scaling state of `history_len` and registers its tensors as
// `module`'s buffers "fp8_<name>_{amax_history,scale,scale_inv}" (the names is_fp8_scaling_state
// recognises): saved in checkpoints, float32 in a bf16 model.
void register_fp8_scaling_state(nn::Module& module, const std::string& name, std::int64_t history_len,
                                te::Fp8ScalingState& state);

class ParallelLinear;

// --fp8-param-gather: every FP8 ParallelLinear of `model` (its weight and FP8 state), for
// te::Fp8PrimaryWeights to keep their weights in FP8 only. Layers outside FP8 (the embedding, the
// output layer, --first-last-layers-bf16's) are not listed.
std::vector<te::Fp8PrimaryWeights::Linear> fp8_linear_weights(nn::Module& model);

class ParallelLinear : public nn::Module {
 public:
  ParallelLinear(ParallelLinearKind kind, std::int64_t in_features, std::int64_t out_features, bool bias,
                 const LayerContext& context, int blocks = 1);
  Tensor forward(const Tensor& x);
  // FP8 with the delayed recipe: x's cast was made by its producer (a fused norm / SwiGLU) into the
  // buffer fp8_input_cast() gave; x is a placeholder carrying the autograd edge (te::fp8_linear).
  Tensor forward(const Tensor& x, const Fp8Tensor& x_cast);
  // Whether this layer takes a producer-made input cast: FP8 with the delayed recipe.
  bool takes_fp8_input() const { return fp8_recipe_ && fp8_recipe_->recipe == te::Fp8ScalingRecipe::Delayed; }
  Fp8Tensor fp8_input_cast(std::int64_t rows, Device device) const {
    return te::fp8_linear_input_cast(fp8_state_, *fp8_recipe_, rows, in_features, device);
  }
  // Column: the input as this rank's GEMM takes it (copy_to, or the sequence all-gather under
  // sequence parallelism); for callers that run the GEMM through a fused op (bias + GeLU). Row: x.
  Tensor parallel_input(const Tensor& x) const;
  // How weight and bias lie over the tensor-parallel group (tensor_parallel_layout.h).
  TensorParallelSplit weight_split() const;
  TensorParallelSplit bias_split() const;
  std::string extra_repr() const override;

  bool is_fp8() const { return fp8_recipe_.has_value(); }
  te::Fp8LinearState& fp8_state() { return fp8_state_; }
  // Delayed FP8: queue the scaling updates on `group` (flushed by the owning layer) instead of
  // running them at each cast.
  void set_fp8_update_group(std::shared_ptr<te::Fp8UpdateGroup> group) { fp8_state_.updates = std::move(group); }

  ParallelLinearKind kind;
  std::int64_t in_features, out_features;  // of the whole layer
  int tensor_parallel_size = 1, tensor_parallel_rank = 0;
  int blocks = 1;
  bool sequence_parallel = false;
  // --tp-comm-overlap (with sequence parallelism): the layer's collectives run in chunks under its
  // GEMMs (tensor_parallel_overlap.h) instead of before / after them.
  bool tp_comm_overlap = false;
  bool gather_output = false;  // Column: all-gather the output slices (Megatron's gather_output)
  Tensor weight, bias;         // this rank's part; bias undefined without one

 protected:
  // An FP8 primary weight (--fp8-param-gather) shows and takes its value, not its bytes.
  Tensor state_value(const std::string& name, const Tensor& stored) const override;
  void load_state_value(const std::string& name, const Tensor& stored, const Tensor& value) override;

 private:
  // x W^T + b on this rank's part, in FP8 when the layer is.
  Tensor local_linear(const Tensor& x, const Tensor& b);
  // FP8 under tensor parallelism: this rank's part `shard` of the split dimension fits the GEMMs and
  // the recipe's blocks, else a clear error naming the flags.
  void check_fp8_shard(const te::Fp8Recipe& recipe, std::int64_t shard) const;

  std::optional<dist::Communicator> tp_;  // set when the group has more than one rank
  std::optional<te::Fp8Recipe> fp8_recipe_;
  te::Fp8LinearState fp8_state_;  // delayed recipe only
};

}  // namespace kiln::models
