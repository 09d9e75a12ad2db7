#pragma once
// CoreOps: how a transformer layer computes, apart from what it is (transformer_spec.h). Megatron
// picks TransformerEngine or local submodule classes in its layer specs; Kiln's layers keep one
// structure and call the compute functions through this table, chosen once from
// GptConfig::transformer_impl. The signatures are those of te/ (GPT_INTERFACES.md), so moving an
// implementation onto the fused kernels is one entry of core_ops_for().
//
// local_core_ops() is composed only of Kiln's differentiable ops (matmul, softmax, layer_norm /
// rms_norm, gelu, silu, cat / narrow views): the reference the fused path is checked against.
#include <cstdint>
#include <functional>
#include <tuple>
#include <utility>

#include "kiln/autograd/random_replay.h"
#include "kiln/models/gpt_config.h"
#include "kiln/runtime/device.h"
#include "kiln/tensor/tensor.h"

namespace kiln::models {

// cos and sin of position * inv_freq, f32 [max_positions, head_dim / 2] on a device.
struct RopeTable {
  Tensor cos, sin;
};

struct CoreAttentionOptions {
  bool causal = true;
  double softmax_scale = 0;  // 0: 1 / sqrt(D)
  // Applied to the attention probabilities when set (attention dropout, training only). The
  // callable owns its random state (an nn::Dropout), so a recompute replays its mask.
  std::function<Tensor(const Tensor&)> probs_dropout;
  // The same dropout for kernels that apply it themselves (te::attention): its probability, and
  // the draw of the mask of `count` = B Hq T S probabilities (nn::Dropout::reserve: the stream
  // position probs_dropout would use on them, replayed on a recompute), so either path drops the
  // same probabilities. Set together with probs_dropout.
  double dropout_p = 0;
  std::function<autograd::RandomDraw(std::int64_t count, Device device)> reserve_dropout;
};

struct CoreOps {
  const char* name = "";
  // q [B,T,Hq,D], k and v [B,S,Hkv,D], Hkv divides Hq (query head h reads kv head h / (Hq / Hkv));
  // causal aligned bottom-right (query i sees keys <= S - T + i); out [B,T,Hq,D].
  std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v, const CoreAttentionOptions&)> attention;
  // (norm(x + residual), x + residual); an undefined residual means none; bias may be undefined.
  std::function<std::pair<Tensor, Tensor>(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                          const Tensor& bias, double eps)>
      add_layer_norm;
  std::function<std::pair<Tensor, Tensor>(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps)>
      add_rms_norm;
  std::function<RopeTable(std::int64_t head_dim, std::int64_t max_positions, double base, bool llama3_scaling,
                          double scaling_factor, Device device)>
      make_rope_table;
  // x [B,T,H,D] rotated (rotate-half, non-interleaved) at positions offset .. offset + T.
  std::function<Tensor(const Tensor& x, const RopeTable& table, std::int64_t position_offset)> apply_rope;
  // Megatron's grouped QKV projection qkv [B,T,G,(P+2)D] (per query group: P query heads, a key
  // head, a value head) split into q [B,T,G P,D] and k, v [B,T,G,D], q and k rotated as apply_rope
  // rotates them at positions offset .. offset + T. The local table composes split_grouped_qkv and
  // apply_rope; transformer_engine's is one kernel each way (te::split_qkv_rope), equal bit for bit.
  std::function<std::tuple<Tensor, Tensor, Tensor>(const Tensor& qkv, std::int64_t head_dim, const RopeTable& table,
                                                   std::int64_t position_offset)>
      split_qkv_rope;
  // [..., 2F] (gate | up) -> silu(gate) * up, [..., F].
  std::function<Tensor(const Tensor& x)> swiglu;
  // GELU(tanh)(x W^T + b); b may be undefined.
  std::function<Tensor(const Tensor& x, const Tensor& weight, const Tensor& bias)> linear_bias_gelu;
  // The whole GELU MLP, GELU(tanh)(x W1^T + b1) W2^T + b2 (biases may be undefined), where an
  // implementation fuses across the two GEMMs (te::linear_gelu_linear: the GELU derivative and fc1's
  // bias gradient as the epilogue of fc2's data-gradient GEMM). Empty: the layers compose
  // linear_bias_gelu and fc2's linear.
  std::function<Tensor(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2)>
      linear_gelu_linear;
  // hidden [N,H], weight [V,H], labels [N] int64, loss_mask [N] (undefined: all ones):
  // f32 scalar sum(CE * mask) / sum(mask), the cross-entropy of logits hidden W^T taken in f32.
  std::function<Tensor(const Tensor& hidden, const Tensor& weight, const Tensor& labels, const Tensor& loss_mask)>
      linear_cross_entropy;
};

// qkv [B,T,G,(P+2)D] in Megatron's grouped layout -> q [B,T,G P,D] (a copy: the groups' query
// heads do not merge into one stride), k and v [B,T,G,D] (strided views of qkv).
std::tuple<Tensor, Tensor, Tensor> split_grouped_qkv(const Tensor& qkv, std::int64_t head_dim);

// The reference implementation: Kiln's existing differentiable ops only.
const CoreOps& local_core_ops();
// te/'s fused kernels (transformer_te_ops.cpp); attention dropout runs fused in te::attention.
const CoreOps& te_core_ops();
// The table for --transformer-impl: local or transformer_engine (te_core_ops()).
const CoreOps& core_ops_for(TransformerImpl impl);

}  // namespace kiln::models
