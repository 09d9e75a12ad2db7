#include "kiln/models/transformer_layer.h"

#include <optional>
#include <string_view>

#include "kiln/autograd/functions.h"

namespace kiln::models {

TransformerLayer::TransformerLayer(const TransformerLayerSpec& spec, std::int64_t layer_number, Generator& seeds,
                                   const LayerContext& context)
    : Module("TransformerLayer"), spec(spec) {
  input_layernorm =
      register_module("input_layernorm", std::make_shared<TransformerNorm>(spec.input_layernorm, context));
  if (spec.mla.enabled)  // MLA
    mla_self_attention = register_module(
        "self_attention",
        std::make_shared<MlaSelfAttention>(spec.self_attention, spec.mla, layer_number, seeds.next_seed(), context));
  else
    self_attention =
        register_module("self_attention",
                        std::make_shared<SelfAttention>(spec.self_attention, layer_number, seeds.next_seed(), context));
  pre_mlp_layernorm =
      register_module("pre_mlp_layernorm", std::make_shared<TransformerNorm>(spec.pre_mlp_layernorm, context));
  if (spec.moe)  // MoE
    moe = register_module("mlp", std::make_shared<MoeLayer>(*spec.moe, context));
  else
    mlp = register_module("mlp", std::make_shared<Mlp>(spec.mlp, context));
  // Under sequence parallelism the hidden dropouts act on each rank's slice of the sequence: each
  // rank draws its own masks (without it the ranks hold the same activations and share the mask).
  auto hidden_seed = [&] {
    const std::uint64_t seed = seeds.next_seed();
    return context.sequence_parallel && context.tensor_parallel_size() > 1
               ? tensor_parallel_dropout_seed(seed, context.tensor_parallel_rank())
               : seed;
  };
  self_attn_dropout =
      register_module("self_attn_dropout", std::make_shared<nn::Dropout>(spec.hidden_dropout, hidden_seed()));
  mlp_dropout = register_module("mlp_dropout", std::make_shared<nn::Dropout>(spec.hidden_dropout, hidden_seed()));
  if (context.fp8 && context.fp8->recipe == te::Fp8ScalingRecipe::Delayed && self_attention && mlp) {
    // Under tensor / context parallelism each flush first max-reduces the queued amaxes over the group.
    const dist::Communicator* amax_group = context.fp8_amax_reduction_group();
    fp8_updates_ = std::make_shared<te::Fp8UpdateGroup>(context.fp8->amax_compute_algo,
                                                        amax_group ? std::optional(*amax_group) : std::nullopt);
    for (ParallelLinear* l : {self_attention->linear_qkv.get(), self_attention->linear_proj.get(),
                              mlp->linear_fc1.get(), mlp->linear_fc2.get()})
      l->set_fp8_update_group(fp8_updates_);
    // Only with te's fused ops: the local ops' norms must keep their own (unfused) numerics. Not
    // under tensor parallelism: the norm's cast would stand where the column layer's copy_to /
    // sequence gather goes (and the SwiGLU's where the row layer's reduction goes).
    fp8_fused_casts_ = context.ops != nullptr && std::string_view(context.ops->name) == "transformer_engine" &&
                       context.tensor_parallel_size() == 1;
  }
}

Tensor TransformerLayer::forward(const Tensor& layer_input, const PositionContext& positions) {
  // The gradient of the layer's input is complete once the layer's whole backward has run: the
  // point where the gradients' queued FP8 updates are flushed.
  const Tensor hidden = te::fp8_flush_on_backward(layer_input, fp8_updates_);
  if (fp8_fused_casts_) {
    // norm -> FP8 qkv input and norm -> FP8 fc1 input in the norm kernels (TE's LayerNormLinear).
    const std::int64_t rows = hidden.numel() / hidden.shape().back();
    const Fp8Tensor qkv_in = self_attention->linear_qkv->fp8_input_cast(rows, hidden.device());
    const Tensor normed_input = input_layernorm->forward_fp8(hidden, Tensor(), qkv_in).first;
    const Tensor attention = self_attention->forward(normed_input, positions, &qkv_in);
    const Fp8Tensor fc1_in = mlp->linear_fc1->fp8_input_cast(rows, hidden.device());
    auto [normed, residual] = pre_mlp_layernorm->forward_fp8(self_attn_dropout->forward(attention), hidden, fc1_in);
    Tensor out = add(mlp_dropout->forward(mlp->forward(normed, &fc1_in, /*fuse_fp8=*/true)), residual);
    fp8_updates_->flush();  // the forward's input and weight casts
    return out;
  }
  const Tensor normed_input = input_layernorm->forward(hidden).first;
  Tensor attention = mla_self_attention ? mla_self_attention->forward(normed_input, positions)  // MLA
                                        : self_attention->forward(normed_input, positions);
  // (pre_mlp_layernorm(hidden + dropout(attention)), hidden + dropout(attention))
  auto [normed, residual] = pre_mlp_layernorm->forward(self_attn_dropout->forward(attention), hidden);
  Tensor out = add(mlp_dropout->forward(moe ? moe->forward(normed) : mlp->forward(normed)), residual);
  if (fp8_updates_) fp8_updates_->flush();  // the forward's input and weight casts
  return out;
}

}  // namespace kiln::models
