#include "kiln/sim/layer_work.h"

#include <algorithm>

#include "kiln/te/grouped_gemm_path.h"

namespace kiln::sim {

using models::Normalization;
using models::PositionEmbedding;
using models::TransformerImpl;
using K = KernelKind;

double Traffic::total() const {
  double t = 0;
  for (double b : bytes) t += b;
  return t;
}

double Traffic::seconds(const CalibrationTable& table, double fallback_bandwidth) const {
  double s = 0;
  for (int k = 0; k < kKernelKinds; ++k) {
    const double b = bytes[static_cast<std::size_t>(k)];
    if (b == 0) continue;
    const double bw = table.kernel_bandwidth(static_cast<KernelKind>(k));
    s += b / (bw > 0 ? bw : fallback_bandwidth);
  }
  return s;
}

double op_calls_seconds(const std::vector<OpCall>& calls, const CalibrationTable& table, Precision p, bool backward) {
  double s = 0;
  for (const OpCall& c : calls)
    if (const OpSample* o = table.op(c.kind, p))
      s += c.calls * (backward ? o->backward : o->forward).seconds(c.elements);
  return s;
}

bool runs_unfused_attention(const models::GptConfig& c) {
  // transformer_engine layers apply attention dropout inside te::attention (Kiln's fused kernels,
  // Auto's choice with dropout): only the local layers take the unfused path.
  return c.transformer_impl == TransformerImpl::Local;
}

namespace {

// te/attention.cpp reads q, k and v in place only through cuDNN on bf16 views; in fp32, or with
// attention dropout (Kiln's kernels: Auto's choice with dropout), it copies them dense and their
// gradients come out separately.
bool attention_copies_qkv(const models::GptConfig& c, const Layout& l) { return !l.bf16 || c.attention_dropout > 0; }

// models/transformer_core_ops.cpp local_attention, forward and backward through autograd. Score
// elements S = B x H x T x S; e: the activation dtype's bytes (the scores are f32 in any case).
UnfusedAttentionWork unfused_attention(double b, double a, double g, double s, double skv, double hd, double e,
                                       bool dropout) {
  UnfusedAttentionWork w;
  const double scores = b * a * s * skv;
  const double nq = b * a * s * hd;        // queries (and the output)
  const double nk = b * a * skv * hd;      // keys or values, one per query head
  const double nkv = b * g * skv * hd;     // keys or values as projected
  const bool gqa = g < a, mixed = e != 4;  // bf16: casts to f32 and back
  auto& f = w.forward;
  f.add(K::Copy, 2 * nq * e);                      // q [B,T,H,D] -> [B,H,T,D] (bmm's contiguous copy)
  if (gqa) f.add(K::Copy, 2 * (nkv + nk) * e);     // k and v heads repeated (expand + reshape copies)
  f.add(K::Copy, 2 * 2 * nk * e);                  // k^T and v made contiguous for the bmms
  f.add(K::Copy, 2 * scores * e);                  // * scale
  if (mixed) f.add(K::Copy, scores * (e + 4));     // .to(f32)
  f.add(K::Copy, 8 * scores);                      // + causal mask (f32)
  f.add(K::Softmax, 12 * scores);                  // softmax (f32): the row read twice (max and sum, then exp)
  if (mixed) f.add(K::Copy, scores * (4 + e));     // .to(bf16)
  if (dropout) f.add(K::Dropout, 6 * scores * e);  // mask, probs * mask, * 1/(1-p)
  f.add(K::Copy, 2 * nq * e);                      // output [B,H,T,D] -> [B,T,H*D] (reshape copy)
  w.gemm_flops_forward = 2 * 2 * scores * hd;      // Q K^T and P V over the whole square
  w.gemm_bytes_forward = (nq + nk + scores) * e + (scores + nk + nq) * e;
  auto& r = w.backward;
  r.add(K::Copy, 2 * nq * e);                   // the output gradient made contiguous
  if (gqa) r.add(K::Copy, 2 * (nk + nkv) * e);  // k and v gradients summed over each group
  if (dropout) r.add(K::Dropout, 5 * scores * e);
  if (mixed) r.add(K::Copy, scores * (e + 4));
  r.add(K::Softmax, 20 * scores);  // read y and dy twice (their dot, then dx), write dx (f32)
  r.add(K::Copy, 4 * scores);      // the mask's gradient, summed over B x H though unused
                                   // (autograd/functions/elementwise.cpp AddBackward)
  if (mixed) r.add(K::Copy, scores * (4 + e));
  r.add(K::Copy, 2 * scores * e);               // * scale
  w.gemm_flops_backward = 4 * 2 * scores * hd;  // dP, dV, dQ, dK
  w.gemm_bytes_backward = 4 * (scores + nq + nk) * e;
  return w;
}

// Bytes of FP8 casts for one linear layer [m, k] x [n, k]^T (te/fp8_linear.cpp) per micro-batch:
// per tensor, one cast of x forward and of the output gradient backward (tensorwise: an amax pass
// first); blockwise, both orientations of each. A ParallelLinear keeps W's casts between
// micro-batches (te/fp8_weight_cache.h: made once per optimizer step, counted by the simulator
// there); the experts' grouped linears (te/fp8_grouped_linear.cpp) cast their weights every call.
void fp8_casts(LayerWork& w, te::Fp8ScalingRecipe recipe, double m, double n, double k, double e,
               bool cached_weight = true) {
  const bool blockwise = recipe == te::Fp8ScalingRecipe::Blockwise;
  const bool current = recipe == te::Fp8ScalingRecipe::Tensorwise;
  const double out_bytes = blockwise ? 2 : 1;
  auto cast = [&](Traffic& t, double elements) {
    t.add(K::Copy, elements * (e + out_bytes));
    if (current) t.add(K::Copy, elements * e);  // the amax pass
  };
  cast(w.fp8_casts_forward, m * k);
  // x's columnwise cast (wgrad's operand): made only when a backward will run (te/fp8_linear.cpp),
  // an FP8 transpose of the rowwise bytes per tensor (read and write a byte), the second output of
  // one quantize pass blockwise (a byte written).
  if (cached_weight) w.fp8_columnwise_forward.add(K::Copy, m * k * (blockwise ? 1 : 2));
  if (cached_weight)
    w.fp8_weights += n * k;
  else
    cast(w.fp8_casts_forward, n * k);
  cast(w.fp8_casts_backward, m * n);
}

// transformer_engine layers op by op (models/transformer_layer.cpp forward, its SelfAttention and
// Mlp, the te/ ops they call): each call here is one call of a calibrated op in the code.
void transformer_engine_calls(LayerWork& w, const ModelSpec& model, const Layout& l, bool moe) {
  const auto& c = model.config;
  const double b = as_double(l.micro_batch_size), s = as_double(c.seq_length) / l.cp, n = b * s;
  const double h = as_double(c.hidden_size), t = l.tp, sp = l.sequence_parallel ? t : 1;
  const double a = as_double(c.num_attention_heads) / t, g = as_double(c.query_groups()) / t,
               hd = as_double(c.head_dim());
  const double f = as_double(c.ffn_hidden()) / t, f1 = c.swiglu ? 2 * f : f;
  const double nh = n * h / sp, nq = n * a * hd, nkv = n * g * hd;
  const bool rms = c.normalization == Normalization::RMSNorm;
  const bool bias = c.add_bias_linear, rope = c.position_embedding_type == PositionEmbedding::Rope;
  auto& fw = w.calls_forward;
  auto& bw = w.calls_backward;
  // input_layernorm (no residual) and pre_mlp_layernorm (attention + residual): te::add_*_norm, their
  // backward through the same op (FP8 layers on one rank write the norm's FP8 cast in the kernel:
  // te/fused_norm.h add_*_norm_fp8, the same bytes).
  fw.push_back({rms ? OpKind::RmsNorm : OpKind::LayerNorm, nh});
  bw.push_back({rms ? OpKind::RmsNorm : OpKind::LayerNorm, nh});
  fw.push_back({rms ? OpKind::RmsNormResidual : OpKind::LayerNormResidual, nh});
  bw.push_back({rms ? OpKind::RmsNormResidual : OpKind::LayerNormResidual, nh});
  // The MLP output + residual (add), and in the backward the layer input's two gradients (the first
  // norm's and the residual's through the second norm) summed by the autograd engine.
  fw.push_back({OpKind::Add, nh});
  bw.push_back({OpKind::Add, nh});
  if (c.hidden_dropout > 0) {  // after the attention and after the MLP
    fw.push_back({OpKind::Dropout, nh, 2});
    bw.push_back({OpKind::Dropout, nh, 2});
  }
  if (rope) {
    // te::split_qkv_rope: q and k rotated and v copied out of the projection in one pass, and their
    // gradients written back into the projection's in one (priced per element by the RoPE sample:
    // each element read once and written once, as apply_rope's).
    fw.push_back({OpKind::Rope, nq + 2 * nkv});
    bw.push_back({OpKind::Rope, nq + 2 * nkv});
  } else if (!runs_unfused_attention(c) && attention_copies_qkv(c, l)) {
    // te/attention.cpp copies q, k and v out of the projection (only cuDNN reads bf16 views in place:
    // not in fp32, and not with attention dropout, which Auto runs in Kiln's kernels) and their
    // gradients come out separately, copied into the projection's gradient by the split's backward.
    fw.push_back({OpKind::Copy, nq});
    fw.push_back({OpKind::Copy, nkv, 2});
    bw.push_back({OpKind::Copy, nq});
    bw.push_back({OpKind::Copy, nkv, 2});
  }
  // Biases: in the GEMM's epilogue (ops::gemm_bias), added after an FP8 GEMM (te/fp8_linear.cpp) and
  // after the row-parallel layers' reduction under TP; the gradient a column sum of the output's.
  auto linear_bias = [&](std::vector<OpCall>& f_calls, std::vector<OpCall>& b_calls, double elements,
                         bool separate_add) {
    if (!bias) return;
    if (l.fp8 || separate_add) f_calls.push_back({OpKind::BiasAdd, elements});
    b_calls.push_back({OpKind::BiasGrad, elements});
  };
  linear_bias(fw, bw, n * as_double(c.qkv_size()) / t, false);
  linear_bias(fw, bw, nh, t > 1);
  if (moe) return;
  w.gelu_mlp = !l.fp8 && !c.swiglu && t == 1;
  if (w.gelu_mlp) {
    // te::linear_gelu_linear (te/gelu_mlp.cpp): fc1's bias and GELU in its GEMM's epilogue, fc2's bias
    // added out of place; backward: fc2's bias gradient, the GELU derivative with fc1's bias gradient
    // in one pass after fc2's data-gradient GEMM.
    w.mlp_calls_forward.push_back({OpKind::BiasAdd, nh});
    if (bias) w.mlp_calls_backward.push_back({OpKind::BiasGrad, nh});
    w.mlp_calls_backward.push_back({OpKind::Gelu, n * f});
    return;
  }
  if (c.swiglu) {  // te::swiglu (te::swiglu_fp8 writing fc2's FP8 input: the same pass)
    fw.push_back({OpKind::Swiglu, n * f});
    bw.push_back({OpKind::Swiglu, n * f});
  } else if (l.fp8 || t > 1) {
    // gelu after an FP8 fc1 (models/transformer_mlp.cpp); under TP te::linear_bias_gelu's epilogue
    // forward, its GELU-derivative pass backward.
    if (l.fp8) fw.push_back({OpKind::Gelu, n * f});
    bw.push_back({OpKind::Gelu, n * f});
  }
  linear_bias(fw, bw, n * f1, false);
  linear_bias(fw, bw, nh, t > 1);
}

}  // namespace

LayerWork layer_work(const ModelSpec& model, const Layout& l, bool moe) {
  const auto& c = model.config;
  LayerWork w;
  const double e = l.bf16 ? 2 : 4;
  const double b = as_double(l.micro_batch_size), s = as_double(c.seq_length) / l.cp, skv = as_double(c.seq_length),
               n = b * s;
  const double h = as_double(c.hidden_size), t = l.tp, sp = l.sequence_parallel ? t : 1;
  const double a = as_double(c.num_attention_heads) / t, g = as_double(c.query_groups()) / t,
               hd = as_double(c.head_dim());
  const double f = as_double(c.ffn_hidden()) / t, f1 = c.swiglu ? 2 * f : f;
  const double nh = n * h / sp, nq = n * a * hd, nkv = n * g * hd, nqkv = nq + 2 * nkv, nf = n * f;
  const bool local = c.transformer_impl == TransformerImpl::Local;
  const bool bias = c.add_bias_linear, rope = c.position_embedding_type == PositionEmbedding::Rope;
  const double dropouts = c.hidden_dropout > 0 ? 2 : 0;
  const bool fp8 = l.fp8;
  auto& fw = w.forward;
  auto& bw = w.backward;

  w.unfused_attention = runs_unfused_attention(c);
  if (w.unfused_attention) w.attention = unfused_attention(b, a, g, s, skv, hd, e, c.attention_dropout > 0);

  // Linear layers: the bias is added in the GEMM's epilogue (autograd/functions/linalg.cpp linear
  // calls ops::gemm_bias: no pass of its own), or out of place after an FP8 GEMM (te/fp8_linear.cpp:
  // read y, write the sum); its gradient is a reduction over the output gradient.
  // The row-parallel layers (proj, fc2) under TP add it after the reduction (models/transformer_linear.cpp).
  auto linear_bias = [&](double elements, bool separate_add) {
    if (!bias) return;
    if (fp8 || separate_add) fw.add(K::Copy, 2 * elements * e);
    bw.add(K::Copy, elements * e);
  };
  linear_bias(nqkv, false);
  linear_bias(nh, t > 1);  // proj
  // Hidden dropout after the attention and after the MLP.
  fw.add(K::Dropout, dropouts * 6 * nh * e);
  bw.add(K::Dropout, dropouts * 5 * nh * e);
  // The layer's final residual add; the layer input's two gradients (the first norm's and the
  // residual's) summed by the engine.
  fw.add(K::Copy, 3 * nh * e);
  bw.add(K::Copy, 3 * nh * e);
  if (local) {
    // models/transformer_core_ops.cpp: layer_norm / rms_norm (read x, write y), the residual add
    // before the second norm, RoPE as narrow / mul / sub / add / cat on q and k.
    fw.add(K::Norm, 2 * 2 * nh * e);
    bw.add(K::Norm, 2 * 3 * nh * e);
    fw.add(K::Copy, 3 * nh * e);  // residual + attention output
    bw.add(K::Copy, 3 * nh * e);  // the residual stream's two gradients summed
    if (rope) {  // on the two halves of q and k (narrowed views) and the broadcast tables: strided kernels
      fw.add(K::Strided, 9 * (nq + nkv) * e);   // 4 products, a difference, a sum, the cat
      bw.add(K::Strided, 15 * (nq + nkv) * e);  // their gradients, the narrows' zero-filled grads summed
    }
    bw.add(K::Copy, 2 * nqkv * e);  // q, k, v gradients written into the qkv projection's (split)
  } else {
    // te/fused_norm.cpp: the first norm writes y and the (copied) sum; the second adds the
    // residual and normalises in one pass; te/rope.cpp one pass each way.
    fw.add(K::Norm, 3 * nh * e + 4 * nh * e);
    bw.add(K::Norm, 3 * nh * e + 4 * nh * e);
    if (rope) {  // te::split_qkv_rope: q, k, v out of the projection (and their gradients back) in one pass
      fw.add(K::Copy, 2 * nqkv * e);
      bw.add(K::Copy, 2 * nqkv * e);
    } else if (!w.unfused_attention) {
      // te/attention.cpp reads q, k, v in place only when they are bf16 views of one packed
      // projection with shared strides and cuDNN runs (no attention dropout); otherwise contiguous
      // copies go in and separate gradients come out (the split copies them back).
      if (attention_copies_qkv(c, l)) {
        fw.add(K::Copy, 2 * nqkv * e);
        bw.add(K::Copy, 2 * nqkv * e);
      }
    } else {
      bw.add(K::Copy, 2 * nqkv * e);
    }
  }
  // The MLP's activation (the experts' for a MoE layer).
  const double act = moe ? n * as_double(model.moe.router_topk) * as_double(model.expert_ffn_hidden()) : nf;
  if (moe) {
    // Dispatch and combine: each routed token copy gathered and scattered back, both ways.
    const double routed = n * as_double(model.moe.router_topk) * h;
    fw.add(K::Copy, 4 * routed * e);
    bw.add(K::Copy, 4 * routed * e);
    w.moe_forward.add(K::Copy, 4 * routed * e);
    w.moe_backward.add(K::Copy, 4 * routed * e);
    if (l.etp > 1) {
      // Expert tensor parallelism reorders the gathered rows expert-major and the partial outputs back
      // (models/expert_tensor_parallel_exchange.cpp: a read and a write each), both ways.
      const double gathered = routed * l.etp;
      for (Traffic* t : {&fw, &bw, &w.moe_forward, &w.moe_backward}) t->add(K::Copy, 4 * gathered * e);
    }
  }
  // transformer_engine's GELU MLP without FP8 (models/transformer_mlp.cpp): fc1's bias and GELU run
  // in the GEMM's epilogue (te/gelu_mlp.cpp linear_gelu_linear on one rank, te/bias_gelu.cpp under
  // TP) and its bias gradient in the GELU-derivative pass: no bias passes of their own. On one rank
  // fc2's bias is then added out of place after its GEMM (read, write) instead of in the epilogue.
  const bool fused_gelu_mlp = !local && !fp8 && !c.swiglu && !moe;
  if (!moe) {
    if (!fused_gelu_mlp) linear_bias(nf * (c.swiglu ? 2 : 1), false);  // fc1
    linear_bias(nh, t > 1 || fused_gelu_mlp);                          // fc2
  }
  if (c.swiglu) {
    if (local) {  // models/transformer_core_ops.cpp local_swiglu: on the narrowed halves of [.., 2F]
      fw.add(K::Strided, 2 * act * e);  // silu(gate)
      fw.add(K::Strided, 3 * act * e);  // * up
      bw.add(K::Copy, 6 * act * e);     // the product's two gradients
      bw.add(K::Activation, 3 * act * e);
      bw.add(K::Strided, 14 * act * e);  // gate and up gradients into zero-filled [.., 2F] buffers, summed
    } else {
      fw.add(K::Activation, 3 * act * e);  // te/swiglu.cpp: read [.., 2F], write [.., F]
      bw.add(K::Activation, 5 * act * e);
    }
  } else if (local || fp8) {
    fw.add(K::Activation, 2 * act * e);  // gelu after the GEMM
    bw.add(K::Activation, 3 * act * e);
  } else {
    fw.add(K::Activation, act * e);  // te/bias_gelu.cpp: the GEMM's epilogue also writes the pre-activation
    bw.add(K::Activation, 3 * act * e);
  }

  // Linear layers [m, k] x [n, k]^T of the layer (the experts' are counted by the simulator).
  if (fp8) {
    const te::Fp8ScalingRecipe recipe = c.fp8_recipe.recipe;
    fp8_casts(w, recipe, n, as_double(c.qkv_size()) / t, h, e);
    fp8_casts(w, recipe, n, h, a * hd, e);
    if (!moe) {
      fp8_casts(w, recipe, n, f1, h, e);
      fp8_casts(w, recipe, n, h, f, e);
    } else {
      // The experts' grouped linears (te/fp8_grouped_linear.cpp): the routed rows (n * top-k, as the
      // simulator spreads them) and their output gradients cast once per GEMM, every local expert's
      // weight cast on its own. (The padding to 16 rows per expert is left out: at most 15 rows each.)
      const double routed = n * as_double(model.moe.router_topk);
      const double experts = std::max(1.0, as_double(model.moe.num_experts) / l.ep);
      const double fe = as_double(model.expert_ffn_hidden());
      const double fe1 = c.swiglu ? 2 * fe : fe;
      fp8_casts(w, recipe, routed, fe1, h, e, false);
      fp8_casts(w, recipe, routed, h, fe, e, false);
      fp8_casts(w, recipe, 0, (experts - 1) * (fe1 + fe), h, e, false);  // the other experts' weights (no rows)
    }
  }

  if (!local) transformer_engine_calls(w, model, l, moe);

  // Parameters of the layer on this device, and how many tensors hold them.
  const double norms = c.normalization == Normalization::LayerNorm ? 4 : 2;
  w.parameters = (h * as_double(c.qkv_size()) + as_double(c.num_attention_heads * c.head_dim()) * h) / t + norms * h;
  if (!moe) w.parameters += (h * f1 + f * h);
  if (bias) w.parameters += as_double(c.qkv_size()) / t + h + (moe ? 0 : f1 + h);
  w.parameter_tensors = norms + (moe ? 2 : 4) * (bias ? 2 : 1);
  for (int i = 0; i < norms; ++i) w.parameter_sizes.push_back(h);
  std::vector<double> outs = {as_double(c.qkv_size()) / t, h};
  std::vector<double> ins = {h, a * hd};
  if (!moe) {
    outs.insert(outs.end(), {f1, h});
    ins.insert(ins.end(), {h, f});
  }
  // With --bf16 the linears add their weight gradients into the fp32 buffers in the GEMM, FP8's too
  // (te/fp8_linear.cpp, since 2026-12-07).
  const bool fused_weights = l.bf16 && l.gradient_accumulation_fusion;
  w.accumulated_parameters = w.parameters;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (fused_weights)
      w.accumulated_parameters -= outs[i] * ins[i];
    else
      w.parameter_sizes.push_back(outs[i] * ins[i]);
    if (bias) w.parameter_sizes.push_back(outs[i]);
  }
  if (moe) {
    // The local experts' two stacked weights (models/moe_experts.cpp weight1 [E, F1, H], weight2 [E, H,
    // F]). With fusion the FP8 experts' wgrad GEMMs add into the fp32 buffers (te/fp8_grouped_linear.cpp),
    // and the bf16 experts' where their weight gradient runs as a loop of per-expert GEMMs (te/moe.cpp:
    // experts of te::kAutoChunkedRows rows or more, at the simulator's even spread); otherwise
    // te::grouped_linear writes the gradients in the model's dtype and AccumulateGrad adds them, one
    // call each per micro-batch.
    const double experts = std::max(1.0, as_double(model.moe.num_experts) / l.ep);
    const double fe = as_double(model.expert_ffn_hidden()) / std::max(1, l.etp);
    const double fe1 = c.swiglu ? 2 * fe : fe;
    const double rows_per_expert = n * as_double(model.moe.router_topk) * l.etp / experts;
    const bool experts_fused = fused_weights && (fp8 || rows_per_expert >= static_cast<double>(te::kAutoChunkedRows));
    if (!experts_fused)
      for (const double size : {experts * fe1 * h, experts * h * fe}) {
        w.parameter_sizes.push_back(size);
        w.accumulated_parameters += size;
      }
  }

  // Recorded ops (a count of the calls in models/transformer_*.cpp and the functions they call).
  double ops = local ? 20 : 14;
  if (rope) ops += local ? 28 : 2;
  if (w.unfused_attention) ops += 14;
  if (c.hidden_dropout > 0) ops += 2;
  if (fp8) ops += (moe ? 2 : 4) * (c.fp8_recipe.recipe == te::Fp8ScalingRecipe::Delayed ? 12 : 6);
  if (moe) ops += 8;
  w.ops_forward = ops;
  w.ops_backward = 2 * ops;
  return w;
}

}  // namespace kiln::sim
