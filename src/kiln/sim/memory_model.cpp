#include "kiln/sim/memory_model.h"

#include <algorithm>
#include <cmath>

#include "kiln/sim/layer_work.h"

namespace kiln::sim {

using models::RecomputeGranularity;
using models::TransformerImpl;

double allocator_block_bytes(double bytes) {
  // The allocator splits its segments to each request rounded to 512 B, so that is what a live
  // tensor counts in its peak (the rest of a segment is reserved, not allocated).
  if (bytes <= 0) return 0;
  constexpr double kRound = 512.0;
  return std::ceil(bytes / kRound) * kRound;
}

namespace {

// Parameters of one transformer layer on one device, split into replicated and expert ones.
StageParameters layer_parameters(const ModelSpec& model, const Layout& l, bool moe) {
  const auto& c = model.config;
  const double h = as_double(c.hidden_size), t = l.tp, bias = c.add_bias_linear ? 1 : 0;
  const double norms = (c.normalization == models::Normalization::LayerNorm ? 4 : 2) * h;
  const double qkv = as_double(c.qkv_size()), proj_in = as_double(c.num_attention_heads * c.head_dim());
  StageParameters p;
  p.dense = (h * qkv + bias * qkv + proj_in * h) / t + bias * h + norms;
  auto mlp = [&](double f) { return h * (c.swiglu ? 2 * f : f) + f * h + bias * ((c.swiglu ? 2 * f : f) + h); };
  if (!moe) {
    p.dense += mlp(as_double(c.ffn_hidden())) / t;
    return p;
  }
  const double fe = as_double(model.expert_ffn_hidden());
  p.dense += h * as_double(model.moe.num_experts);  // the router
  if (model.moe.shared_expert_ffn_size > 0) p.dense += mlp(as_double(model.moe.shared_expert_ffn_size)) / t;
  // Not split by TP; --expert-tensor-parallel-size splits each expert's F (its slice of fc1's rows and
  // fc2's columns).
  p.expert = mlp(fe / l.etp) * as_double(model.moe.num_experts) / l.ep;
  return p;
}

bool is_moe_layer(const ModelSpec& model, std::int64_t layer) {
  return model.moe.enabled() && layer % model.moe.layer_freq == 0;
}

// One FP8 cast of a [rows, cols] matrix as ops::fp8_alloc allocates it: the one-byte data and its
// scale, scale_inv and amax tensors, each of fp8_scale_shape's size in f32. The delayed recipe's
// casts (te/fp8_linear.cpp) take the scale of the layer's state and free the allocated one; a
// rowwise cast (cast_both's first, cast_rowwise's, a producer's fp8_linear_input_cast, and that
// one's transposed copy, which shares its scales) records its amax into the state's history too,
// while cast_both's columnwise cast keeps its own amax (`columnwise`). Per-tensor scales are one
// element (a 512 B block); the blockwise recipe's are one per 128 columns of each row (activations,
// 1x128) or per 128x128 block (weights): for activations 3 x 4 / 128 bytes per element besides the
// data.
double fp8_cast_bytes(const models::GptConfig& c, double rows, double cols, bool weight, bool columnwise) {
  const bool blockwise = c.fp8_recipe.recipe == te::Fp8ScalingRecipe::Blockwise;
  const double scales = blockwise ? (weight ? std::ceil(rows / 128) * std::ceil(std::ceil(cols / 128) / 4) * 4
                                            : std::ceil(cols / 128) * std::ceil(rows / 4) * 4)
                                  : 1;
  const double tensors = c.fp8_recipe.recipe == te::Fp8ScalingRecipe::Delayed ? (columnwise ? 2 : 1) : 3;
  return allocator_block_bytes(rows * cols) + tensors * allocator_block_bytes(scales * 4);
}

// The delayed recipe's scaling state of one FP8 ParallelLinear (models/transformer_linear.cpp,
// te::Fp8ScalingState::fresh): for its input, its weight and its output's gradient an amax history
// f32 [amax_history_len], a scale and a scale_inv f32 [1], nine buffers of the model's.
double fp8_scaling_state_bytes(const models::GptConfig& c) {
  if (c.fp8_recipe.recipe != te::Fp8ScalingRecipe::Delayed) return 0;
  return 3 * (allocator_block_bytes(as_double(c.fp8_recipe.amax_history_len) * 4) + 2 * allocator_block_bytes(4));
}

// The delayed recipe's fused casts (TransformerLayer::fp8_fused_casts_: transformer_engine layers on
// one rank): the norms (and with SwiGLU the activation) write the next FP8 linear's input cast.
bool fp8_fused_casts(const models::GptConfig& c, const Layout& l) {
  return l.fp8 && c.fp8_recipe.recipe == te::Fp8ScalingRecipe::Delayed && l.tp == 1 &&
         c.transformer_impl != TransformerImpl::Local;
}

// The layers of one model chunk of `stage`: without virtual stages the stage's own layers (an
// uneven split's first and last stages hold their own number); with them, the device's first chunk
// (all chunks hold the same number of layers).
struct ChunkLayers {
  std::int64_t first = 0, count = 0;
};
ChunkLayers chunk_layers(const ModelSpec& model, const Layout& l, int stage) {
  const auto [begin, end] = stage_layer_ranges(model, l)[static_cast<std::size_t>(stage)];
  if (l.vpp == 1) return {begin, end - begin};
  const std::int64_t count = model.config.num_layers / (static_cast<std::int64_t>(l.pp) * l.vpp);
  return {stage * count, count};
}

}  // namespace

std::vector<std::pair<double, double>> stage_fp8_linear_shapes(const ModelSpec& model, const Layout& l, int stage) {
  std::vector<std::pair<double, double>> out;
  if (!l.fp8) return out;
  const auto& c = model.config;
  // The layers of one chunk, times the device's chunks. A MoE layer's FP8 ParallelLinears are its
  // attention's and its shared expert's.
  const auto [first_layer, layers_per_chunk] = chunk_layers(model, l, stage);
  const double h = as_double(c.hidden_size), hd = as_double(c.head_dim());
  const double heads = as_double(c.num_attention_heads) / l.tp;
  auto mlp = [&](double f) {
    out.emplace_back(c.swiglu ? 2 * f : f, h);
    out.emplace_back(h, f);
  };
  for (int chunk = 0; chunk < l.vpp; ++chunk)
    for (std::int64_t i = 0; i < layers_per_chunk; ++i) {
      out.emplace_back(as_double(c.qkv_size()) / l.tp, h);
      out.emplace_back(h, heads * hd);
      if (!is_moe_layer(model, first_layer + i))
        mlp(as_double(c.ffn_hidden()) / l.tp);
      else if (model.moe.shared_expert_ffn_size > 0)
        mlp(as_double(model.moe.shared_expert_ffn_size) / l.tp);
    }
  return out;
}

double stage_fp8_weight_elements(const ModelSpec& model, const Layout& l, int stage) {
  double elements = 0;
  for (const auto& [out, in] : stage_fp8_linear_shapes(model, l, stage)) elements += out * in;
  return elements;
}

StageParameters stage_parameters(const ModelSpec& model, const Layout& l, int stage) {
  const auto& c = model.config;
  StageParameters p;
  // The stage's own layers (an uneven split's first and last stages differ); with virtual stages a
  // device holds every pp-th chunk, counted as one block: the layer mix is the same on average.
  const auto [begin, end] = stage_layer_ranges(model, l)[static_cast<std::size_t>(stage)];
  for (std::int64_t layer = begin; layer < end; ++layer) {
    const StageParameters lp = layer_parameters(model, l, is_moe_layer(model, layer));
    p.dense += lp.dense;
    p.expert += lp.expert;
  }
  const double h = as_double(c.hidden_size), vocab = as_double(c.padded_vocab_size()) / l.tp;
  if (stage == 0) {
    p.dense += vocab * h;
    if (c.position_embedding_type == models::PositionEmbedding::LearnedAbsolute)
      p.dense += as_double(c.max_positions()) * h;
  }
  if (stage == l.pp - 1) {
    const double norm = (c.normalization == models::Normalization::LayerNorm ? 2 : 1) * h;
    p.dense += norm;
    // The output layer: its own weights when untied; a tied one is a second copy on the last stage.
    if (c.untie_embeddings_and_output_weights || l.pp > 1) p.dense += vocab * h;
    if (c.mtp_num_layers > 0) {
      // MTP (models/multi_token_prediction.h), on the last stage: per depth a dense layer of the
      // decoder's spec, eh_proj (2H -> H, column-parallel, no bias) and three norms; under pipeline
      // parallelism untied embeddings add the stage's copy of the word embeddings (a tied copy is
      // counted above and serves both).
      p.dense += as_double(c.mtp_num_layers) * (layer_parameters(model, l, false).dense + 2 * h * h / l.tp + 3 * norm);
      if (l.pp > 1 && c.untie_embeddings_and_output_weights) p.dense += vocab * h;
    }
  }
  return p;
}

double layer_activation_bytes(const ModelSpec& model, const Layout& l, bool moe) {
  const auto& c = model.config;
  const double e = l.bf16 ? 2 : 4;
  const double b = as_double(l.micro_batch_size), s = as_double(c.seq_length) / l.cp, skv = as_double(c.seq_length);
  const double n = b * s;  // tokens on this device
  const double h = as_double(c.hidden_size), t = l.tp;
  const double a = as_double(c.num_attention_heads) / t, g = as_double(c.query_groups()) / t,
               hd = as_double(c.head_dim());
  const double f = as_double(c.ffn_hidden()) / t;
  const double sp = l.sequence_parallel ? t : 1;
  const bool hidden_dropout = c.hidden_dropout > 0, attention_dropout = c.attention_dropout > 0;
  const bool layer_norm = c.normalization == models::Normalization::LayerNorm;
  double bytes = 0;
  auto keep = [&](double elements, double element_bytes, double count = 1) {
    bytes += count * allocator_block_bytes(elements * element_bytes);
  };
  // Token copies this device's experts see: expert tensor parallelism gathers its group's rows, each
  // through this device's F / etp slice of the experts.
  const double fe = moe ? as_double(model.expert_ffn_hidden()) / l.etp : 0;
  // Under sequence parallelism each tensor-parallel rank routes its own slice of the sequence.
  const double routed = moe ? n / sp * as_double(model.moe.router_topk) : 0;
  const double rows = routed * l.etp;
  const double gemm_in = l.fp8 ? 1 : e;
  // A GEMM input the linear keeps for its weight gradient: the high-precision tensor, or under FP8
  // (te/fp8_linear.h) only its columnwise cast, the [cols, rows] x^T in one byte (with its scales).
  // The delayed recipe's fused casts (TransformerLayer::fp8_fused_casts_: transformer_engine, one
  // rank, a dense layer) make QKV's and fc1's inputs (and with SwiGLU fc2's) in their producers; the
  // kept x^T is then a transposed copy sharing the producer's scales (`fused`).
  const bool fused_casts = fp8_fused_casts(c, l) && !moe;
  auto keep_gemm_input = [&](double rows, double cols, bool fused = false) {
    if (l.fp8)
      bytes += fp8_cast_bytes(c, cols, rows, false, /*columnwise=*/!fused);
    else
      keep(rows * cols, e);
  };
  // A MoE layer's MLP part (models/moe_layer.cpp, the same whatever --transformer-impl): the router's
  // logits / probabilities (f32), the dispatched (and gathered) rows the experts' fc1 keeps, its
  // output and the activation's (fc2's input), the expert outputs the combine keeps, and the shared
  // expert's MLP (`shared_mlp`: the implementation's dense MLP at its width).
  auto keep_moe_mlp = [&](const auto& shared_mlp) {
    keep(n / sp * as_double(model.moe.num_experts), 4);
    keep(rows * h, gemm_in);
    keep(rows * (c.swiglu ? 2 * fe : fe), e);
    keep(rows * fe, gemm_in);
    keep(routed * h, e);
    if (l.etp > 1) {
      // Expert tensor parallelism's exchange (models/expert_tensor_parallel_exchange.cpp) keeps, per
      // micro-batch, its two row orders (int64 [rows], which the reorders' backwards hold) and the
      // gathered rows' expert offsets (the grouped GEMMs'); the dispatched rows themselves are only
      // sent, not kept.
      keep(rows, 8, 2);
      keep(as_double(model.moe.num_experts) / l.ep + 1, 8);
    }
    if (model.moe.shared_expert_ffn_size > 0) shared_mlp(as_double(model.moe.shared_expert_ffn_size) / t);
  };

  if (c.transformer_impl == TransformerImpl::Local) {
    // Kiln's local layers, as models/transformer_*.cpp record them. Under sequence parallelism the
    // norms and the residual sums act on this rank's slice of the sequence; the norms' outputs are
    // not kept there, but the column-parallel layers' gathered inputs [N, H] are
    // (tensor_parallel_mappings.cpp's sequence all-gather makes a new tensor, which QKV's and fc1's
    // GEMMs keep); without it the norms' outputs are those inputs (copy_to is a view).
    // QKV's and fc1's inputs (LN1's, LN2's outputs); a MoE layer routes LN2's output as it is (its
    // slice under SP: the router's linear keeps it).
    keep_gemm_input(n, h);
    if (moe)
      keep(n * h / sp, e);
    else
      keep_gemm_input(n, h);
    keep(n * h / sp, e, 2);                      // residual sum, layer output
    if (hidden_dropout) keep(n * h / sp, e, 2);  // the two hidden-dropout masks
    keep(n / sp, 4, layer_norm ? 4 : 2);         // norm statistics (mean and rstd per token)
    // RoPE keeps nothing: its products with the (constant) cos/sin tables save the tables only.
    if (l.cp > 1 && l.cp_comm_type == models::CpCommType::P2P) {
      // Context parallelism's ring (models/context_parallel_attention.cpp ring_attention) runs the
      // fused attention per block and keeps contiguous copies of q, k, v, the merged output (the
      // projection's input, a view of it) and the log-sum-exp [B, heads, T/CP] f32: no scores.
      // Attention dropout is refused there, and selective recompute has nothing to drop.
      keep(n * a * hd, e);
      keep(n * g * hd, e, 2);
      keep(n * a * hd, e);
      keep(b * a * s, 4);
      if (l.fp8) bytes += fp8_cast_bytes(c, a * hd, n, false, true);  // the FP8 projection's cast of it
    } else if (l.recompute != RecomputeGranularity::Selective) {
      keep(n * a * hd, e, 3);      // q, k^T, v as the batched matmuls keep them
      keep_gemm_input(n, a * hd);  // the attention output (the projection's input)
      keep(b * a * s * skv, 4);    // softmax output (f32)
      if (attention_dropout)
        keep(b * a * s * skv, e, 2);  // dropout mask and output
      else if (l.bf16)
        keep(b * a * s * skv, e);  // the probabilities cast back to bf16
    } else {
      // The recomputed attention keeps its inputs only: the q copy, the qkv output (k and v are
      // views of it), and its output.
      keep(n * a * hd, e);
      keep_gemm_input(n, a * hd);
      keep(n * (a + 2 * g) * hd, e);
    }
    auto local_mlp = [&](double width) {
      // fc1 output (gate | up) and silu output, or fc1's output; then fc2's input (the product, or
      // gelu's output).
      keep(n * width, e, c.swiglu ? 3 : 1);
      keep_gemm_input(n, width);
    };
    if (moe)
      keep_moe_mlp(local_mlp);
    else
      local_mlp(f);
    return bytes;
  }

  // Fused (transformer_engine): flash attention keeps q, k, v, its output and log-sum-exp (with
  // attention dropout too: the mask is regenerated in backward, te/attention_dropout.h); SP shards
  // what lives between the TP regions; FP8 keeps the GEMM inputs in one byte.
  // The column-parallel linears keep their whole inputs [N, H]: the norm's output, or under SP its
  // all-gather over the group (models/transformer_linear.cpp's parallel_input; the norm's own slice
  // is freed). A MoE layer routes LN2's output (its slice under SP) as it is.
  keep(n * h / sp, e);                 // layer input (LN1's)
  keep_gemm_input(n, h, fused_casts);  // QKV's input
  if (!runs_unfused_attention(c)) {
    keep(n * (a + 2 * g) * hd, e);
    keep(n * a, 4);  // softmax statistics
  } else if (l.recompute != RecomputeGranularity::Selective) {
    keep(n * a * hd, e);           // q
    keep(b * a * skv * hd, e, 2);  // k^T, v (one per query head)
    keep(b * a * s * skv, 4);      // softmax output (f32)
    if (attention_dropout)
      keep(b * a * s * skv, e, 2);
    else if (l.bf16)
      keep(b * a * s * skv, e);
  } else {
    keep(n * a * hd, e);
    keep(n * (a + 2 * g) * hd, e);
  }
  // The attention output: te::attention keeps it for its backward (te/attention.cpp, the output saved
  // with q, k, v and the statistics), in the activation dtype, and it is the projection's input; an
  // FP8 projection keeps its FP8 cast of it besides (te/fp8_linear.cpp: the columnwise cast).
  keep(n * a * hd, e);
  if (l.fp8) bytes += fp8_cast_bytes(c, a * hd, n, false, true);
  if (hidden_dropout) keep(n * h / sp, e, 2);         // the two hidden-dropout masks, in the activation dtype
  keep(n * h / sp, e);                                // LN2 input (residual)
  keep_gemm_input(moe ? n / sp : n, h, fused_casts);  // fc1's or the router's input
  auto fused_mlp = [&](double width) {
    keep(n * (c.swiglu ? 2 * width : width), e);
    keep_gemm_input(n, width, fused_casts && c.swiglu);
  };
  if (moe)
    keep_moe_mlp(fused_mlp);
  else
    fused_mlp(f);
  return bytes;
}

namespace {

// Bytes a dense layer keeps for what runs after its core attention (freed, in its backward, before
// the attention's backward runs): the attention output (the projection's input), the residual
// sums and the second norm's output, the hidden-dropout masks, the MLP's tensors.
double after_attention_bytes(const ModelSpec& model, const Layout& l) {
  const auto& c = model.config;
  const double e = l.bf16 ? 2 : 4;
  const double n = as_double(l.micro_batch_size) * as_double(c.seq_length) / l.cp, h = as_double(c.hidden_size),
               t = l.tp;
  const double sp = l.sequence_parallel ? t : 1, f = as_double(c.ffn_hidden()) / t;
  const double a = as_double(c.num_attention_heads) / t, hd = as_double(c.head_dim());
  const bool local = c.transformer_impl == TransformerImpl::Local;
  const double gemm_in = l.fp8 ? 1 : e;
  double bytes = allocator_block_bytes(n * a * hd * (local ? e : gemm_in));
  // Local: the residual sum, fc1's input (LN2's output, or under SP its gathered copy [N, H]) and
  // the layer's output; fused: the residual sum and LN2's output.
  if (local) bytes += allocator_block_bytes(n * h * e);
  bytes += 2 * allocator_block_bytes(n * h / sp * e);
  if (c.hidden_dropout > 0) bytes += 2 * allocator_block_bytes(n * h / sp * e);
  if (local)
    bytes += (c.swiglu ? 4 : 2) * allocator_block_bytes(n * f * e);
  else
    bytes += allocator_block_bytes(n * (c.swiglu ? 2 * f : f) * e) + allocator_block_bytes(n * f * gemm_in);
  return bytes;
}

// What a dense transformer_engine layer holds besides what it keeps for its backward, at the two
// moments of a step that hold the most (measured on the CPU, where the same code allocates the same
// tensors; docs/simulate.md): with every layer's activations kept, the forward of the last layer
// reaches its fc2 GEMM, and the backward of that layer reaches its MLP's activation.
struct LayerTransients {
  double forward = 0, backward = 0;
};

double local_mlp_backward_bytes(const ModelSpec& model, const Layout& l);

LayerTransients layer_transients(const ModelSpec& model, const Layout& l) {
  const auto& c = model.config;
  const double e = l.bf16 ? 2 : 4;
  const double n = as_double(l.micro_batch_size) * as_double(c.seq_length) / l.cp, h = as_double(c.hidden_size);
  const double sp = l.sequence_parallel ? l.tp : 1, f = as_double(c.ffn_hidden()) / l.tp;
  const double hidden = allocator_block_bytes(n * h / sp * e), act = allocator_block_bytes(n * f * e);
  LayerTransients t;
  // Forward, at fc2: the layer's input (forward_layers holds it while the layer runs), the
  // projection's output (TransformerLayer::forward's `attention`, alive to the layer's end) and
  // fc2's output.
  t.forward = 3 * hidden;
  if (l.fp8) {
    // The FP8 linears keep their inputs' columnwise casts only, so the tensors a bf16 layer keeps as
    // GEMM inputs live for the layer's forward alone: the two norms' outputs (with the fused casts,
    // the unwritten placeholders te::add_rms_norm_fp8 allocates), the activation's output (SwiGLU's
    // or GeLU's, or swiglu_fp8's placeholder) and fc2's rowwise cast of it.
    t.forward += 2 * hidden + act + fp8_cast_bytes(c, n, f, false, false);
    // The delayed recipe's fused casts (TransformerLayer::fp8_fused_casts_: transformer_engine
    // layers, one rank): the QKV and fc1 inputs' rowwise casts are the layer forward's locals. (The
    // local layers' casts are fp8_linear's own, freed when it returns.)
    if (fp8_fused_casts(c, l)) t.forward += 2 * fp8_cast_bytes(c, n, h, false, false);
  }
  // Backward, at the MLP's activation: the gradient of the layer's output, fc2's data gradient (the
  // activation output's gradient) and the activation's input gradient [N, fc1 width]; fc2's saved
  // input (the activation's output, or its FP8 cast) is freed by then.
  const double fc2_input = l.fp8 ? fp8_cast_bytes(c, f, n, false, !(fp8_fused_casts(c, l) && c.swiglu)) : act;
  t.backward = hidden + act + allocator_block_bytes(n * (c.swiglu ? 2 * f : f) * e) - fc2_input;
  // Before that, at fc2's own backward: without FP8 it is the local layers' LinearBackward (the same
  // ParallelLinear), which also returns the weight gradient unless gradient-accumulation fusion adds
  // it into the buffer (fp32 weights: --bf16 off or --no-gradient-accumulation-fusion).
  if (!l.fp8) t.backward = std::max(t.backward, local_mlp_backward_bytes(model, l));
  if (l.recompute == RecomputeGranularity::Full) {
    // Full recompute rebuilds the layer from its kept input (counted with the layers): its forward
    // holds the incoming gradient instead of that input, and its backward holds the recomputed
    // output (the root autograd::checkpoint's backward takes the gradient of) besides.
    t.backward += hidden;
  }
  return t;
}

// What a local layer's backward holds besides the tensors the layers keep, at its fc2 (traced with
// the allocator on the CPU, docs/simulate.md): fc2's LinearBackward (autograd/functions/linalg.cpp)
// returns its data gradient [N, F/TP] and, unless gradient-accumulation fusion adds it into the
// fp32 gradient buffer (bf16 weights only), its weight gradient [H, F/TP] in the weights' dtype
// (with one rank and a bias, the bias's [H] too: under TP it is added after the reduction) at once,
// while the gradient of the layer's output it was given is alive (under SP besides that the
// gradient's all-gather over the group, the reduce-scatter's backward). fc2's input (kept, counted
// with the layer) is released only after the node has run.
double local_mlp_backward_bytes(const ModelSpec& model, const Layout& l) {
  const auto& c = model.config;
  const double e = l.bf16 ? 2 : 4, param_bytes = l.bf16 ? 2 : 4;
  const double n = as_double(l.micro_batch_size) * as_double(c.seq_length) / l.cp, h = as_double(c.hidden_size);
  const double sp = l.sequence_parallel ? l.tp : 1, f = as_double(c.ffn_hidden()) / l.tp;
  double bytes = allocator_block_bytes(n * h / sp * e);
  if (sp > 1) bytes += allocator_block_bytes(n * h * e);
  bytes += allocator_block_bytes(n * f * e);
  if (!(l.bf16 && l.gradient_accumulation_fusion)) bytes += allocator_block_bytes(h * f * param_bytes);
  if (c.add_bias_linear && l.tp == 1) bytes += allocator_block_bytes(h * param_bytes);
  return bytes;
}

// What a MoE layer's forward holds under expert tensor parallelism besides the tensors the layers
// keep, at its scatter (models/expert_tensor_parallel_exchange.cpp, traced with the allocator on the
// CPU, docs/simulate.md): linear_fc2's partial sums for the group's rows [rows, H], their
// rank-major copy and the rows received back [rows, H] before they are summed onto this rank's
// own. Besides, TransformerLayer::forward holds to the layer's end what the layer does not keep:
// under SP the first norm's output slice (QKV's linear keeps its gathered copy); with the
// transformer_engine layers, which keep neither, the layer's input (forward_layers') and the
// attention's output. (The dispatched rows, alive to the layer's end too, stand for the summed rows
// not allocated yet, and the local layers' attention output for their output: the same sizes.)
double etp_scatter_bytes(const ModelSpec& model, const Layout& l) {
  const auto& c = model.config;
  const double e = l.bf16 ? 2 : 4;
  const double n = as_double(l.micro_batch_size) * as_double(c.seq_length) / l.cp, h = as_double(c.hidden_size);
  const double sp = l.sequence_parallel ? l.tp : 1;
  const double rows = n / sp * as_double(model.moe.router_topk) * l.etp;
  const double hidden = allocator_block_bytes(n * h / sp * e);
  const bool local = c.transformer_impl == TransformerImpl::Local;
  return 3 * allocator_block_bytes(rows * h * e) + (l.sequence_parallel ? hidden : 0) + (local ? 0 : 2 * hidden);
}

// What the MTP depths keep on the last stage for a micro-batch's backward
// (models/multi_token_prediction.cpp), per depth: the shifted tokens, labels and mask; the
// embedding's output (and its dropout mask); enorm's and hnorm's outputs and statistics, their
// concatenation [N, 2H] (eh_proj's input, whole under TP), eh_proj's output (the layer's input);
// a dense layer's activations; the final norm's output and statistics; and the output layer's loss
// buffers as the main loss keeps them.
double mtp_activation_bytes(const ModelSpec& model, const Layout& l) {
  const auto& c = model.config;
  const double e = l.bf16 ? 2 : 4;
  const double n = as_double(l.micro_batch_size) * as_double(c.seq_length) / l.cp, h = as_double(c.hidden_size);
  const double sp = l.sequence_parallel ? l.tp : 1;
  const double hidden = allocator_block_bytes(n * h / sp * e), stats = allocator_block_bytes(n / sp * 4);
  const double statistics = c.normalization == models::Normalization::LayerNorm ? 2 : 1;
  const double tokens = as_double(l.micro_batch_size) * as_double(c.seq_length);
  double depth = 2 * allocator_block_bytes(tokens * 8) + allocator_block_bytes(tokens * 4);
  depth += hidden * (c.hidden_dropout > 0 ? 2 : 1);  // the embedding (and its dropout mask)
  depth += 2 * hidden + 2 * statistics * stats;      // enorm, hnorm
  depth += allocator_block_bytes(2 * n * h * e);     // their concatenation
  depth += hidden;                                   // eh_proj's output
  depth += layer_activation_bytes(model, l, false);
  depth += hidden + statistics * stats;  // the final norm
  depth += allocator_block_bytes(n * as_double(c.padded_vocab_size()) / l.tp * 4);
  return as_double(c.mtp_num_layers) * depth;
}

}  // namespace

MemoryBreakdown stage_memory(const ModelSpec& model, const Layout& l, int stage, int in_flight_chunks,
                             double fragmentation, bool host_device) {
  const auto& c = model.config;
  MemoryBreakdown m;
  const StageParameters p = stage_parameters(model, l, stage);
  const double param_bytes = l.bf16 ? 2 : 4;
  // Flat buffers (optim/param_and_grad_buffer: the parameters and the fp32 gradients, one buffer
  // each for the dense and the expert parameters), each one allocation, rounded to the block.
  auto flat = [](double dense, double expert) { return allocator_block_bytes(dense) + allocator_block_bytes(expert); };
  m.parameters = flat(p.dense * param_bytes, p.expert * param_bytes);
  m.gradients = flat(p.dense * 4, p.expert * 4);
  // Adam's two moments, plus fp32 masters under bf16 (optim/flat_optimizer: an f32 tensor each per
  // buffer); sharded over the data-parallel ranks (the experts' over the expert-data-parallel ones)
  // by the distributed optimizer.
  const double states = l.bf16 ? 3 : 2;
  const double dense_shards = l.distributed_optimizer ? static_cast<double>(l.dp) * l.cp : 1;
  const double expert_shards =
      l.distributed_optimizer ? static_cast<double>(l.dp) * l.cp * l.tp / std::max(1, l.ep * l.etp) : 1;
  m.optimizer = states * flat(p.dense * 4 / dense_shards, p.expert * 4 / expert_shards);

  // Activations: the layers of one chunk (chunk_layers) times the chunks the schedule holds.
  const auto [first_layer, layers_per_chunk] = chunk_layers(model, l, stage);
  const double e = l.bf16 ? 2 : 4;
  const double b = as_double(l.micro_batch_size), n = b * as_double(c.seq_length) / l.cp, h = as_double(c.hidden_size);
  const double sp = l.sequence_parallel ? l.tp : 1;
  double chunk = 0, one_layer_full = 0;
  for (std::int64_t i = 0; i < layers_per_chunk; ++i) {
    const bool moe = is_moe_layer(model, first_layer + i);
    const double full = layer_activation_bytes(model, l, moe);
    one_layer_full = std::max(one_layer_full, full);
    // Full recompute keeps each layer's input only; one layer is rebuilt at a time in the backward.
    chunk += l.recompute == RecomputeGranularity::Full ? allocator_block_bytes(n * h / sp * e) : full;
  }
  m.activations = chunk * in_flight_chunks;
  const std::vector<std::pair<double, double>> fp8_linears = stage_fp8_linear_shapes(model, l, stage);
  if (l.fp8) {
    // Each FP8 ParallelLinear keeps its weight's rowwise and columnwise casts (one byte each) in its
    // te::Fp8WeightCache from the first forward that records a backward until the weight changes,
    // when the next such forward replaces them: two bytes per linear weight of every layer on the
    // stage, whatever is in flight (te/fp8_weight_cache.h). (The experts' grouped linears cast
    // theirs per call, not counted here.)
    // Each cast is an allocation of its own (fp8_cast_bytes: rounded to the allocator's block, with
    // its scales). --fp8-param-gather: the rowwise cast is the parameter itself (counted in
    // m.parameters below); the cache holds the columnwise one only, an fp8 transpose of the bytes
    // (per tensor it shares the weight's scales: the data alone).
    // Each linear also holds the delayed recipe's scaling state (fp8_scaling_state_bytes).
    const bool blockwise = c.fp8_recipe.recipe == te::Fp8ScalingRecipe::Blockwise;
    for (const auto& [out, in] : fp8_linears)
      m.fp8_copies +=
          (!c.fp8_param_gather ? fp8_cast_bytes(c, out, in, true, false) + fp8_cast_bytes(c, in, out, true, true)
           : blockwise         ? fp8_cast_bytes(c, in, out, true, true)
                               : allocator_block_bytes(in * out)) +
          fp8_scaling_state_bytes(c);
  }
  if (l.fp8 && c.fp8_param_gather) {
    const double fp8_weight_elements = stage_fp8_weight_elements(model, l, stage);
    // --fp8-param-gather (te/fp8_primary_weights.h): the FP8 linears' weights are one byte each, in
    // an fp8 parameter buffer of their own, and have no copy in the model's dtype; their fp32 masters
    // exist in an f32 model too (in a bf16 one they were counted). (The scales: a few small tensors.)
    m.parameters = flat((p.dense - fp8_weight_elements) * param_bytes, p.expert * param_bytes) +
                   allocator_block_bytes(fp8_weight_elements);
    if (!l.bf16) m.optimizer += allocator_block_bytes(fp8_weight_elements * 4 / dense_shards);
  }
  if (l.recompute == RecomputeGranularity::Full && in_flight_chunks > 0) m.activations += one_layer_full;
  const double vocab = as_double(c.padded_vocab_size()) / l.tp;
  const double logits = allocator_block_bytes(n * vocab * 4);
  const bool local = c.transformer_impl == TransformerImpl::Local;
  if (stage == 0) {
    // The embedding's output (the first layer's input; each layer above counts its own output) and
    // its dropout mask, for every micro-batch in flight.
    const double embedding = allocator_block_bytes(n * h / sp * e) * (c.hidden_dropout > 0 ? 2 : 1);
    m.activations += embedding * in_flight_chunks;
  }
  double loss_held = 0;  // what the last stage holds for the loss only, freed before the layers' backward
  if (stage == l.pp - 1) {
    // Final norm output and statistics, and the log-probabilities (f32) of the micro-batch in its
    // backward; the loss's backward adds the gradient scattered into [N, V] (gather's backward) and
    // log-softmax's input gradient. The fused cross-entropy keeps one [N, V] buffer for both.
    // The output layer's GEMM keeps its input [N, H]: the final norm's output, or under sequence
    // parallelism that gathered over the group (models/output_layer_loss.cpp; the norm's own
    // [N / TP, H] slice is not kept).
    loss_held = allocator_block_bytes(n * h * e) + allocator_block_bytes(n / sp * 4) * 2 + logits;
    m.activations += loss_held;
    m.transient = (local ? 2 : 1) * logits;
    // Under tensor parallelism the loss is the vocabulary-parallel cross-entropy
    // (models/vocab_parallel.cpp), whichever the implementation: its forward ends holding this rank's
    // logits, their shifted copy (kept, counted above as `logits`) and its exp (kept), where the fused
    // loss never holds the logits whole; its backward holds more, at exp's backward: the shifted
    // copy, the exp, the label gather's gradient scattered into [N, V / TP] (waiting to be summed
    // with the exp's branch), the sum's gradient expanded to [N, V / TP] and exp's input gradient:
    // four besides the one counted (the logits themselves are freed after the forward: sub's backward
    // keeps nothing).
    if (l.tp > 1) m.transient = 4 * logits;
    if (c.mtp_num_layers > 0) m.activations += mtp_activation_bytes(model, l);
  }
  const bool ring_attention = l.cp > 1 && l.cp_comm_type == models::CpCommType::P2P;
  if (ring_attention && in_flight_chunks > 0 && layers_per_chunk > 0) {
    // The ring's backward (models/context_parallel_attention.cpp ring_backward), of the last layer:
    // its dq and the travelling dk, dv accumulators (f32), the next keys and values arriving, and,
    // when the step's gradients are passed on, the dk, dv arriving; by then the layer's backward
    // has freed what it kept for the parts after the attention, and the loss's tensors are gone.
    const double q_elems = n * as_double(c.num_attention_heads) / l.tp * as_double(c.head_dim());
    const double kv_elems = n * as_double(c.query_groups()) / l.tp * as_double(c.head_dim());
    const double ring = allocator_block_bytes(q_elems * 4) + 4 * allocator_block_bytes(kv_elems * 4) +
                        2 * allocator_block_bytes(kv_elems * e);
    m.transient = std::max(m.transient, ring - after_attention_bytes(model, l));
  }
  if (runs_unfused_attention(c) && !ring_attention && in_flight_chunks > 0) {
    // The unfused attention's backward (models/transformer_core_ops.cpp through autograd) holds more
    // than the layer kept: at the dropout's backward the f32 probabilities, the mask, the incoming
    // gradient and its product (the dropout output was released by the bmm's backward); at the
    // softmax's backward the probabilities, its f32 input gradient and output (12 bytes per score).
    // Selective recompute first rebuilds what the layer did not keep (the probabilities, mask,
    // dropout output and the q / k^T / v copies).
    const double scores =
        b * as_double(c.num_attention_heads) / l.tp * as_double(c.seq_length) / l.cp * as_double(c.seq_length);
    const bool dropout = c.attention_dropout > 0;
    const double peak =
        std::max(allocator_block_bytes(scores * 4) * 3,
                 dropout ? allocator_block_bytes(scores * 4) + 3 * allocator_block_bytes(scores * e) : 0);
    const double kept =
        allocator_block_bytes(scores * 4) +
        (dropout ? 2 * allocator_block_bytes(scores * e) : (l.bf16 ? allocator_block_bytes(scores * e) : 0));
    const double copies =
        3 * allocator_block_bytes(n * as_double(c.num_attention_heads) / l.tp * as_double(c.head_dim()) * e);
    // By then the layer's backward has freed what it kept for the parts after the attention (the
    // projection's input, the residual sums, the second norm, the dropout masks, the MLP), and the
    // loss's temporaries are gone: the larger of the two moments counts.
    const double after = after_attention_bytes(model, l);
    const double attention =
        std::max(0.0, (l.recompute == RecomputeGranularity::Selective ? peak + copies : peak - kept) - after);
    m.transient = std::max(m.transient, attention);
  }
  if (local && in_flight_chunks > 0 && layers_per_chunk > 0 &&
      !is_moe_layer(model, first_layer + layers_per_chunk - 1)) {
    // Local layers: the last layer's backward at its fc2 (local_mlp_backward_bytes). On the last
    // stage the loss's tensors are freed by then, and so is the last layer's output (the final norm's
    // saved input; MTP's hnorm, which also takes it, has run its backward before); with the
    // embedding on the same device, a tied output layer's weight gradient [V / TP, H] waits for the
    // embedding's backward, which adds the other part of that parameter's gradient (the engine's
    // AccumulateGrad runs once both are in; with gradient-accumulation fusion none is made). On the
    // other stages the stage's output is alive (the executor's outputs and, on the host, its send).
    double bw = local_mlp_backward_bytes(model, l);
    if (stage == l.pp - 1) {
      bw -= loss_held + allocator_block_bytes(n * h / sp * e);
      if (c.mtp_num_layers > 0) bw -= mtp_activation_bytes(model, l);
      if (l.pp == 1 && !c.untie_embeddings_and_output_weights && !(l.bf16 && l.gradient_accumulation_fusion))
        bw += allocator_block_bytes(vocab * h * param_bytes);
    }
    m.transient = std::max(m.transient, bw);
    // FP8: the linears keep one-byte casts of their inputs, so the high-precision inputs live for the
    // layer's forward only, as in the transformer_engine layers (layer_transients' forward moment).
    if (l.fp8) m.transient = std::max(m.transient, layer_transients(model, l).forward - loss_held);
  }
  if (!local && in_flight_chunks > 0 && layers_per_chunk > 0 &&
      !is_moe_layer(model, first_layer + layers_per_chunk - 1)) {
    // transformer_engine layers: the last layer's forward at its fc2 and its backward at its MLP's
    // activation hold more than its kept tensors (layer_transients); the loss's tensors are not
    // allocated yet at the first moment and freed at the second. Full recompute: the layer rebuilt
    // is the one counted whole above.
    const LayerTransients lt = layer_transients(model, l);
    m.transient = std::max(m.transient, std::max(lt.forward, lt.backward) - loss_held);
  }
  if (l.etp > 1 && in_flight_chunks > 0) {
    // Expert tensor parallelism: the forward of the chunk's last MoE layer at its scatter
    // (etp_scatter_bytes), with the layers after it not run yet and the loss's tensors not
    // allocated.
    double after = 0;
    for (std::int64_t i = layers_per_chunk - 1; i >= 0; --i) {
      if (is_moe_layer(model, first_layer + i)) {
        m.transient = std::max(m.transient, etp_scatter_bytes(model, l) - after - loss_held);
        break;
      }
      after += l.recompute == RecomputeGranularity::Full ? allocator_block_bytes(n * h / sp * e)
                                                         : layer_activation_bytes(model, l, false);
    }
  }
  // The batch (tokens, labels int64, loss mask f32) of every micro-batch, uploaded together.
  const double tokens = b * as_double(c.seq_length) / l.cp;
  m.other = static_cast<double>(l.micro_batches()) *
            (2 * allocator_block_bytes(tokens * 8) + allocator_block_bytes(tokens * 4));
  if (runs_unfused_attention(c))
    m.other +=
        allocator_block_bytes(as_double(c.seq_length) * as_double(c.seq_length) * 4);  // the unfused path's causal mask
  if (c.position_embedding_type == models::PositionEmbedding::Rope)
    m.other += 2 * allocator_block_bytes(as_double(c.max_positions()) * as_double(c.head_dim()) / 2 * 4);
  if (host_device && l.pp > 1 && in_flight_chunks > 0) {
    // train/pipeline_executor.cpp keeps each send's tensor until the step's end; on the host that is
    // the activation itself, alive past its micro-batch's backward. At the stage's last forward every
    // forward send of the step is posted, the in-flight ones counted above: the rest add one [N, H]
    // each (measured on the CPU: +64 KiB on stage 0 per micro-batch of 256 tokens at hidden 64, fp32).
    // The input gradients sent backward are fresh tensors, kept likewise: at the last backward all
    // but the micro-batches still in flight have been sent (the last stage's peak, one in flight).
    const double m_step = as_double(l.micro_batches());
    const double forward_sends = m_step * as_double(stage < l.pp - 1 ? l.vpp : l.vpp - 1);
    const double backward_sends = m_step * as_double(stage > 0 ? l.vpp : l.vpp - 1);
    const double held = std::max(0.0, forward_sends - as_double(in_flight_chunks)) +
                        std::max(0.0, backward_sends - as_double(in_flight_chunks));
    m.other += held * allocator_block_bytes(n * h / sp * e);
  }
  m.fragmentation = fragmentation * (m.activations + m.transient);
  return m;
}

}  // namespace kiln::sim
