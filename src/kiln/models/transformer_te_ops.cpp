// The TransformerEngine table of CoreOps: te/'s fused kernels behind the signatures the layers call.
// A config never changes meaning with --transformer-impl, only speed: attention dropout runs inside
// te::attention with the mask nn::Dropout would draw on the local path's probabilities (the same
// (seed, offset) and Philox stream, te/attention_dropout.h).
#include "kiln/models/transformer_core_ops.h"
#include "kiln/te/attention.h"
#include "kiln/te/bias_gelu.h"
#include "kiln/te/fused_norm.h"
#include "kiln/te/gelu_mlp.h"
#include "kiln/te/linear_cross_entropy.h"
#include "kiln/te/qkv_rope.h"
#include "kiln/te/rope.h"
#include "kiln/te/swiglu.h"

namespace kiln::models {

namespace {

Tensor te_attention(const Tensor& q, const Tensor& k, const Tensor& v, const CoreAttentionOptions& o) {
  te::AttentionOptions options;
  options.causal = o.causal;
  options.softmax_scale = o.softmax_scale;
  if (o.reserve_dropout) {
    // The mask of the [B, Hq, T, S] probabilities, one draw per forward (a recompute replays it).
    const std::int64_t count = q.size(0) * q.size(2) * q.size(1) * k.size(1);
    const autograd::RandomDraw draw = o.reserve_dropout(count, q.device());
    options.dropout = o.dropout_p;
    options.dropout_seed = draw.seed;
    options.dropout_offset = draw.offset;
    options.dropout_offset_counter = draw.device_offset;
  } else if (o.probs_dropout) {
    // Only a callable, not a counter-based draw te::attention can regenerate: the local op runs it.
    return local_core_ops().attention(q, k, v, o);
  }
  return te::attention(q, k, v, options);
}

RopeTable te_make_rope_table(std::int64_t head_dim, std::int64_t max_positions, double base, bool llama3_scaling,
                             double scaling_factor, Device device) {
  te::RopeTable t = te::make_rope_table(head_dim, max_positions, base, llama3_scaling, scaling_factor, device);
  return RopeTable{t.cos, t.sin};
}

Tensor te_apply_rope(const Tensor& x, const RopeTable& table, std::int64_t position_offset) {
  return te::apply_rope(x, te::RopeTable{table.cos, table.sin}, position_offset);
}

std::tuple<Tensor, Tensor, Tensor> te_split_qkv_rope(const Tensor& qkv, std::int64_t head_dim, const RopeTable& table,
                                                     std::int64_t position_offset) {
  te::SplitQkv out = te::split_qkv_rope(qkv, head_dim, te::RopeTable{table.cos, table.sin}, position_offset);
  return {out.q, out.k, out.v};
}

CoreOps make_te_core_ops() {
  CoreOps ops;
  ops.name = "transformer_engine";
  ops.attention = te_attention;
  ops.add_layer_norm = te::add_layer_norm;
  ops.add_rms_norm = te::add_rms_norm;
  ops.make_rope_table = te_make_rope_table;
  ops.apply_rope = te_apply_rope;
  ops.split_qkv_rope = te_split_qkv_rope;
  ops.swiglu = te::swiglu;
  ops.linear_bias_gelu = te::linear_bias_gelu;
  ops.linear_gelu_linear = te::linear_gelu_linear;
  ops.linear_cross_entropy = [](const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                                const Tensor& loss_mask) {
    return te::linear_cross_entropy(hidden, weight, labels, loss_mask);
  };
  return ops;
}

}  // namespace

const CoreOps& te_core_ops() {
  static const CoreOps ops = make_te_core_ops();
  return ops;
}

}  // namespace kiln::models
