#include "kiln/sim/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>

#include "kiln/sim/collective_cost.h"
#include "kiln/sim/layer_work.h"

namespace kiln::sim {

using models::RecomputeGranularity;

namespace {

struct PassTimes {
  double forward = 0, backward = 0, weight = 0;  // compute of one layer and micro-batch
  LayerTimes parts;
  double tp = 0, ep = 0, cp_exposed = 0;  // communication on the critical path (fwd + bwd)
};

// One layer, one micro-batch, on one device.
PassTimes layer_times(const ModelSpec& model, const Layout& l, const SystemSpec& sys, const CalibrationTable* cal,
                      bool moe) {
  const auto& c = model.config;
  const Precision gemm_p = l.fp8 ? Precision::FP8 : (l.bf16 ? Precision::BF16 : Precision::FP32);
  const Precision p = l.bf16 ? Precision::BF16 : Precision::FP32;
  // Without a table: the roofline at what the device's GEMMs reach (SystemSpec::achievable_gemm_fraction).
  const double usable = cal ? 1.0 : sys.achievable_gemm_fraction;
  const double peak = usable * (sys.peak_flops(gemm_p) > 0 ? sys.peak_flops(gemm_p) : sys.peak_flops(p));
  const std::int64_t b = l.micro_batch_size, s = c.seq_length / l.cp, n = b * s;
  const std::int64_t h = c.hidden_size, t = l.tp;
  const std::int64_t heads = c.num_attention_heads / t, hd = c.head_dim();
  const std::int64_t f = c.ffn_hidden() / t, f1 = c.swiglu ? 2 * f : f;
  const double e = l.bf16 ? 2 : 4;
  const bool cpu = sys.name == "cpu";
  const CalibrationTable none;
  const CalibrationTable& table = cal ? *cal : none;
  auto gemm = [&](std::int64_t m, std::int64_t out, std::int64_t k, double scale = 1.0) {
    // FP8 against a table measured in bf16: the bf16 time at the FP8/bf16 peak ratio.
    if (gemm_p == Precision::FP8 && cal) {
      const double bf16 = table.gemm_seconds(m, out, k, Precision::BF16, sys.peak_flops_bf16);
      return scale * bf16 * sys.peak_flops_bf16 / sys.peak_flops_fp8;
    }
    return scale * table.gemm_seconds(m, out, k, gemm_p, peak);
  };
  PassTimes r;
  // Forward GEMMs; the backward runs each twice (input gradient, weight gradient).
  std::vector<std::array<std::int64_t, 3>> gemms = {{n, c.qkv_size() / t, h}, {n, h, heads * hd}};
  if (!moe) {
    gemms.push_back({n, f1, h});
    gemms.push_back({n, h, f});
  }
  // Per linear layer (forward, weight gradient, data gradient).
  const std::size_t layers = gemms.size();
  std::vector<double> lf(layers), lw(layers), ld(layers);
  for (std::size_t i = 0; i < layers; ++i) {
    const auto& g = gemms[i];
    lf[i] = gemm(g[0], g[1], g[2]);
    lw[i] = gemm(g[2], g[1], g[0]);
    ld[i] = gemm(g[0], g[2], g[1]);
  }
  if (cal && gemm_p != Precision::FP8) {
    // Measured linear layers (forward; dgrad and wgrad together) where the table has them: the
    // layouts and sustained rate of training's GEMMs, not a lone x W product.
    std::vector<std::pair<double, double>> measured;
    for (const auto& g : gemms)
      if (const auto m = table.linear_seconds(g[0], g[1], g[2], gemm_p)) measured.push_back(*m);
    if (measured.size() == layers)
      for (std::size_t i = 0; i < layers; ++i) {
        const double share = lw[i] / (lw[i] + ld[i]);
        lf[i] = measured[i].first;
        lw[i] = measured[i].second * share;
        ld[i] = measured[i].second * (1 - share);
      }
  }
  const LayerWork work = layer_work(model, l, moe);
  // transformer_engine's GELU MLP measured whole (te::linear_gelu_linear: fc1, fc2, their bias and
  // GELU passes) where the table has it: it replaces fc1's and fc2's GEMMs and the MLP's op calls.
  bool mlp_measured = false;
  if (cal && work.gelu_mlp && layers == 4)
    if (const auto m = table.gelu_mlp_seconds(n, f, h, gemm_p)) {
      const double w_share = (lw[2] + lw[3]) / (lw[2] + lw[3] + ld[2] + ld[3]);
      lf[2] = m->first;
      lw[2] = m->second * w_share;
      ld[2] = m->second * (1 - w_share);
      lf[3] = lw[3] = ld[3] = 0;
      mlp_measured = true;
    }
  double fwd = 0, wgrad = 0, dgrad = 0;
  for (std::size_t i = 0; i < layers; ++i) {
    fwd += lf[i];
    wgrad += lw[i];
    dgrad += ld[i];
  }
  if (moe) {
    // Routed tokens spread over the experts: each device's experts see n * topk tokens on average.
    // Expert tensor parallelism gathers the routed rows of its etp ranks, each running its F / etp
    // slice of every expert on all of them (models/moe_experts.cpp): the same FLOPs in other shapes.
    const std::int64_t routed = n * model.moe.router_topk, rows = routed * l.etp;
    const std::int64_t local_experts = std::max<std::int64_t>(1, model.moe.num_experts / l.ep);
    const std::int64_t fe = model.expert_ffn_hidden() / std::max(1, l.etp);
    const std::int64_t fe1 = c.swiglu ? 2 * fe : fe;
    const std::int64_t per_expert = std::max<std::int64_t>(1, rows / local_experts);
    const double x = static_cast<double>(local_experts);
    const double ef = gemm(per_expert, fe1, h, x) + gemm(per_expert, h, fe, x);
    fwd += ef + gemm(n, model.moe.num_experts, h);
    wgrad += gemm(h, fe1, per_expert, x) + gemm(fe, h, per_expert, x);
    dgrad += gemm(per_expert, h, fe1, x) + gemm(per_expert, fe, h, x);
    if (model.moe.shared_expert_ffn_size > 0) {
      const std::int64_t fs = model.moe.shared_expert_ffn_size / t, fs1 = c.swiglu ? 2 * fs : fs;
      fwd += gemm(n, fs1, h) + gemm(n, h, fs);
      wgrad += gemm(h, fs1, n) + gemm(fs, h, n);
      dgrad += gemm(n, h, fs1) + gemm(n, fs, h);
    }
    // Dispatch and combine: each token's hidden state to its topk experts and back.
    const Link link = group_link(sys, l.ep, l.tp * l.cp);
    const double bytes = as_double(routed) * as_double(h) * e;
    r.ep = 4 * all_to_all_seconds(bytes, l.ep, link);  // forward 2, backward 2
    if (l.moe_token_dispatcher == models::MoeTokenDispatcher::AllGather) {
      // Every rank's tokens (and routing) gathered over the group, its experts run on all of them, the
      // partial outputs reduce-scattered back; the backward is the transpose (a reduce-scatter, a gather).
      const double gathered = as_double(l.ep) * as_double(n) * as_double(h) * e;
      r.ep = 2 * (all_gather_seconds(gathered, l.ep, link) + reduce_scatter_seconds(gathered, l.ep, link));
    }
    if (l.etp > 1) {
      // Expert tensor parallelism (models/expert_tensor_parallel_exchange.h): the dispatched rows
      // gathered over the etp adjacent ranks before the experts, linear_fc2's partial outputs summed
      // back onto their owners after them (each an all-to-all of whole rows: an all-gather's and a
      // reduce-scatter's bytes); the backward runs each as the other.
      const Link etp_link = group_link(sys, l.etp, 1);
      const double gathered = as_double(rows) * as_double(h) * e;
      r.ep += 2 * (all_gather_seconds(gathered, l.etp, etp_link) + reduce_scatter_seconds(gathered, l.etp, etp_link));
    }
  }
  const double mem_bw = table.memory_bandwidth > 0 ? table.memory_bandwidth : 0.7 * sys.memory_bandwidth;
  // Attention: te/'s fused kernel from the table (its dropout samples with attention dropout); the
  // unfused path (local layers) from its own samples, else its traffic at the kernels' bandwidth and its batched
  // GEMMs at the usable peak (whichever is slower).
  double attn_f = 0, attn_b = 0;
  if (!work.unfused_attention) {
    std::tie(attn_f, attn_b) =
        table.attention_seconds(b, heads, s, c.seq_length, hd, p, usable * sys.peak_flops(p), c.attention_dropout > 0);
  } else if (auto m = table.unfused_attention_seconds(b, heads, s, c.seq_length, hd, p, c.attention_dropout > 0)) {
    std::tie(attn_f, attn_b) = *m;
  } else {
    const auto& u = work.attention;
    const double rate = sys.achievable_gemm_fraction * sys.peak_flops(p);
    const double scale = cpu ? 4.0 / e : 1.0;  // as for the other memory-bound kernels below
    attn_f =
        scale * u.forward.seconds(table, mem_bw) + std::max(u.gemm_flops_forward / rate, u.gemm_bytes_forward / mem_bw);
    attn_b = scale * u.backward.seconds(table, mem_bw) +
             std::max(u.gemm_flops_backward / rate, u.gemm_bytes_backward / mem_bw);
  }
  // FP8 linear layers: measured whole per recipe (casts included) where the table has them.
  if (l.fp8 && cal) {
    std::vector<std::array<std::int64_t, 3>> fp8_gemms = {{n, c.qkv_size() / t, h}, {n, h, heads * hd}};
    if (!moe) {
      fp8_gemms.push_back({n, f1, h});
      fp8_gemms.push_back({n, h, f});
    }
    double measured = 0;
    bool all = true;
    for (const auto& g : fp8_gemms) {
      const auto m = table.fp8_linear_seconds(g[0], g[1], g[2], c.fp8_recipe.recipe);
      all = all && m.has_value();
      if (m) measured += *m;
    }
    if (all) {
      // Replace the dense layers' FP8 GEMMs estimated above by the measured layers (a third forward).
      double est_f = 0, est_w = 0, est_d = 0;
      for (std::size_t i = 0; i < fp8_gemms.size(); ++i) {
        est_f += lf[i];
        est_w += lw[i];
        est_d += ld[i];
      }
      fwd += measured / 3 - est_f;
      wgrad += measured / 3 - est_w;
      dgrad += measured / 3 - est_d;
    }
  }
  const bool fp8_measured = l.fp8 && cal && !table.fp8_linear.empty();
  // The CPU's kernels compute in f32 whatever the storage (ops/cpu): they cost per element, so
  // bf16 traffic there counts as f32's; on a GPU they are bandwidth-bound and bf16 halves them.
  const double dtype_scale = cpu ? 4.0 / e : 1.0;
  // transformer_engine layers with a table of op samples: each op call at its measured fixed cost
  // plus per-element cost (docs/simulate.md); otherwise the bytes at each kernel kind's bandwidth.
  const bool op_priced = cal && !work.calls_forward.empty() && table.has_ops(p);
  double elementwise_f = 0, elementwise_b = 0;
  if (op_priced) {
    elementwise_f = op_calls_seconds(work.calls_forward, table, p, false) + work.moe_forward.seconds(table, mem_bw);
    elementwise_b = op_calls_seconds(work.calls_backward, table, p, true) + work.moe_backward.seconds(table, mem_bw);
    if (!mlp_measured) {
      elementwise_f += op_calls_seconds(work.mlp_calls_forward, table, p, false);
      elementwise_b += op_calls_seconds(work.mlp_calls_backward, table, p, true);
    }
  } else {
    elementwise_f = dtype_scale * work.forward.seconds(table, mem_bw);
    elementwise_b = dtype_scale * work.backward.seconds(table, mem_bw);
  }
  if (l.fp8 && !fp8_measured) {
    elementwise_f += work.fp8_casts_forward.seconds(table, mem_bw);
    elementwise_b += work.fp8_casts_backward.seconds(table, mem_bw);
  }
  // Each micro-batch's parameter gradients accumulate into the fp32 buffers (autograd/node.cpp
  // AccumulateGrad: read the gradient and the buffer, write the buffer), one call per tensor;
  // the fused linears' weights (LayerWork::accumulated_parameters) are added by their GEMMs.
  const double copy_bw =
      table.kernel_bandwidth(KernelKind::Copy) > 0 ? table.kernel_bandwidth(KernelKind::Copy) : mem_bw;
  double accumulate = work.accumulated_parameters * (e + 8) / copy_bw;
  if (const OpSample* acc = cal ? table.op(OpKind::Accumulate, p) : nullptr) {
    accumulate = 0;
    for (const double size : work.parameter_sizes) accumulate += acc->forward.seconds(size);
  }
  // The host records and launches every op; on a GPU that runs ahead of the kernels (asynchronous
  // launches), so a pass takes the longer of the two; on the CPU they add up.
  const double gpu_f = fwd + attn_f + elementwise_f;
  const double gpu_b = dgrad + wgrad + attn_b + elementwise_b + accumulate;
  const double host_f = table.op_overhead * work.ops_forward, host_b = table.op_overhead * work.ops_backward;
  r.parts = {fwd,           dgrad + wgrad, attn_f, attn_b, elementwise_f,
             elementwise_b, accumulate,    host_f, host_b, work.unfused_attention};
  r.forward = cpu ? gpu_f + host_f : std::max(gpu_f, host_f);
  r.weight = wgrad;
  r.backward = cpu ? gpu_b + host_b : std::max(gpu_b, host_b);
  if (l.recompute == RecomputeGranularity::Full) {
    // The backward reruns the forward as training records it; the first forward ran without
    // gradients (models/transformer_block.cpp) and so without the FP8 inputs' columnwise casts.
    r.backward += r.forward;
    if (l.fp8) {
      const double no_grad_f = gpu_f - work.fp8_columnwise_forward.seconds(table, mem_bw);
      r.forward = cpu ? no_grad_f + host_f : std::max(no_grad_f, host_f);
    }
  }
  if (l.recompute == RecomputeGranularity::Selective) r.backward += attn_f;
  if (t > 1) {
    // Two TP regions per layer (attention, MLP); each is an all-reduce of the hidden state
    // forward and backward, or an all-gather plus a reduce-scatter with SP (same bytes).
    const Link link = group_link(sys, static_cast<int>(t), 1);
    const double bytes = as_double(n) * as_double(h) * e;
    const double gather = all_gather_seconds(bytes, static_cast<int>(t), link),
                 scatter = reduce_scatter_seconds(bytes, static_cast<int>(t), link);
    const double one = l.sequence_parallel ? gather + scatter : all_reduce_seconds(bytes, static_cast<int>(t), link);
    r.tp = 2 * 2 * one;
    if (l.tp_comm_overlap) {
      // --tp-comm-overlap (models/tensor_parallel_overlap.h): each collective runs as t - 1 ring
      // exchanges, each beside the GEMM of one of the t chunks, the last chunk's GEMM after them: what
      // exceeds (t - 1) / t of the GEMM it runs beside stays on the path. The column linears' input
      // gather runs beside their forward GEMM and their gradient's reduce-scatter beside the data
      // gradient; the row linears the other way round. The weight gradients come after.
      const double beside = as_double(t - 1) / as_double(t);
      auto exposed = [&](double comm, double gemm_seconds) { return std::max(0.0, comm - beside * gemm_seconds); };
      auto region = [&](std::size_t column, std::size_t row) {
        return exposed(gather, lf[column]) + exposed(scatter, lf[row]) + exposed(scatter, ld[column]) +
               exposed(gather, ld[row]);
      };
      // The MLP's region only where it is two linears of its own (a MoE layer's experts are not).
      r.tp = region(0, 1) + (layers == 4 && !mlp_measured ? region(2, 3) : 2 * one);
    }
  }
  if (l.cp > 1 && l.cp_comm_type == models::CpCommType::A2A) {
    // Ulysses: q, k and v all-to-all'd from this rank's tokens of every head to every token of its
    // heads before attention, the output back after it; the backward the same four for the
    // gradients. Nothing runs beside them.
    const Link link = group_link(sys, l.cp, l.tp);
    const double q = as_double(n) * as_double(heads) * as_double(hd) * e,
                 kv = as_double(n) * as_double(c.query_groups() / t) * as_double(hd) * e;
    r.cp_exposed = 2 * (2 * all_to_all_seconds(q, l.cp, link) + 2 * all_to_all_seconds(kv, l.cp, link));
  } else if (l.cp > 1) {
    // Ring attention: cp - 1 exchanges of the K/V block (forward), twice that backward (K/V and
    // their gradients), overlapped with the attention blocks.
    const Link link = group_link(sys, l.cp, l.tp);
    const double kv = 2 * as_double(n) * as_double(c.query_groups() / t) * as_double(hd) * e;
    const double comm = 3 * (l.cp - 1) * send_recv_seconds(kv, link);
    r.cp_exposed = std::max(0.0, comm - (attn_f + attn_b));
  }
  return r;
}

}  // namespace

double model_flops_per_token(const ModelSpec& model) {
  const auto& c = model.config;
  double flops = c.flops_per_token();
  // A config that carries the experts itself (--num-experts) is counted by GptConfig already.
  if (!model.moe.enabled() || c.num_experts > 0) return flops;
  // Replace the dense MLP of the MoE layers by topk experts, the shared expert and the router.
  const double h = as_double(c.hidden_size), mats = c.swiglu ? 3 : 2;
  const double fe = as_double(model.expert_ffn_hidden());
  const double per_layer_dense = 6 * mats * h * as_double(c.ffn_hidden());
  const double per_layer_moe =
      6 * (mats * h * fe * as_double(model.moe.router_topk) + mats * h * as_double(model.moe.shared_expert_ffn_size) +
           h * as_double(model.moe.num_experts));
  return flops + as_double(model.moe.moe_layers(c.num_layers)) * (per_layer_moe - per_layer_dense);
}

Prediction predict(const ModelSpec& model, const Layout& l, const SystemSpec& sys, const CalibrationTable* cal,
                   const PredictOptions& o) {
  Prediction r;
  r.layout = l;
  r.invalid = check_layout(model, l, l.devices(), sys.peak_flops_fp8 > 0);
  if (!r.invalid.empty()) return r;
  const auto& c = model.config;
  // Each stage's layers per chunk: an uneven split (--decoder-first/last-pipeline-num-layers) gives
  // the first and last stages their own number, so their passes take their own time.
  const auto ranges = stage_layer_ranges(model, l);
  std::vector<std::int64_t> stage_layers;
  for (const auto& [begin, end] : ranges) stage_layers.push_back((end - begin) / l.vpp);
  // The stage with the most layers (the first of them): its chunk is the one reported, and its
  // parameters' reduction and update the ones timed (it finishes its step last).
  const auto largest =
      static_cast<int>(std::max_element(stage_layers.begin(), stage_layers.end()) - stage_layers.begin());
  const PassTimes dense = layer_times(model, l, sys, cal, false);
  const PassTimes moe = model.moe.enabled() ? layer_times(model, l, sys, cal, true) : dense;
  const double moe_share = model.moe.enabled() ? as_double(model.moe.moe_layers(c.num_layers)) / as_double(c.num_layers)
                                               : 0.0;  // average chunk
  const double e = l.bf16 ? 2 : 4;
  const double n = as_double(l.micro_batch_size) * as_double(c.seq_length) / l.cp;
  // One micro-batch through a chunk of `layers` layers (the embedding and loss added below).
  auto chunk_times = [&](std::int64_t layers) {
    auto mix = [&](double a, double b) { return as_double(layers) * ((1 - moe_share) * a + moe_share * b); };
    StageTimes st;
    const double tp = mix(dense.tp, moe.tp), ep = mix(dense.ep, moe.ep), cp = mix(dense.cp_exposed, moe.cp_exposed);
    // DualPipe overlaps one micro-batch's forward with another's backward: the all-to-all hides behind
    // that compute, what exceeds it stays exposed.
    const double chunk_compute = mix(dense.forward + dense.backward, moe.forward + moe.backward);
    const double ep_on_path = l.schedule == ScheduleKind::DualPipe ? std::max(0.0, ep - chunk_compute) : ep;
    const double comm = tp + ep_on_path + cp;
    st.forward = mix(dense.forward, moe.forward) + comm / 3;
    st.backward = mix(dense.backward, moe.backward) + 2 * comm / 3;
    st.weight_fraction = mix(dense.weight, moe.weight) / st.backward;
    return std::tuple{st, tp, ep, cp};
  };
  StageTimes st;
  std::tie(st, r.tp_seconds_per_chunk, r.ep_seconds_per_chunk, r.cp_exposed_per_chunk) =
      chunk_times(stage_layers[static_cast<std::size_t>(largest)]);
  double head_forward = 0, head_backward = 0, mtp_forward = 0, mtp_backward = 0;
  // The embedding (first stage) and the logits and loss (last stage), spread over the chunks as an
  // average.
  {
    const Precision p = l.bf16 ? Precision::BF16 : Precision::FP32;
    const CalibrationTable none;
    const CalibrationTable& table = cal ? *cal : none;
    const std::int64_t v = c.padded_vocab_size() / l.tp, tokens = static_cast<std::int64_t>(n);
    const double usable = cal ? 1.0 : sys.achievable_gemm_fraction;
    const double peak = usable * sys.peak_flops(p);
    const double mem_bw = table.memory_bandwidth > 0 ? table.memory_bandwidth : 0.7 * sys.memory_bandwidth;
    const bool local = c.transformer_impl == models::TransformerImpl::Local;
    const double h = as_double(c.hidden_size), nv = n * as_double(v), nh = n * h;
    const double logits = table.gemm_seconds(tokens, v, c.hidden_size, p, peak);
    const double dgrad = table.gemm_seconds(tokens, c.hidden_size, v, p, peak);
    const double wgrad = table.gemm_seconds(v, c.hidden_size, tokens, p, peak);
    Traffic fwd, bwd;
    double loss_f = 0, loss_b = 0;
    if (local) {
      // linear, .to(f32), log_softmax, gather; backward: the gather's zero-filled [N, V] gradient,
      // log_softmax's, the cast back, two GEMMs.
      fwd.add(KernelKind::Copy, nv * (e + 4));
      fwd.add(KernelKind::Softmax, 8 * nv);
      bwd.add(KernelKind::Copy, 4 * nv + nv * (4 + e));
      bwd.add(KernelKind::Softmax, 12 * nv);
      loss_f = logits;
      loss_b = dgrad + wgrad;
    } else {
      // te/linear_cross_entropy.cpp: the logits, the hidden and weight gradients, all in the
      // forward (chunk by chunk); the kernel reads and rewrites each chunk's logits.
      fwd.add(KernelKind::Copy, 2 * nv * e);
      bwd.add(KernelKind::Copy, 3 * (nh + as_double(v) * h) * e);  // both gradients scaled by the loss's
      loss_f = logits + dgrad + wgrad;
    }
    // Final norm; the embedding's gather (+ learned positions) and dropout, its gradient's
    // zero-filled [V, H] table and scatter (or, fused, the rows into the fp32 table); the output
    // weight's gradient accumulated (tied or not).
    fwd.add(KernelKind::Norm, 3 * nh * e);
    bwd.add(KernelKind::Norm, 3 * nh * e);
    fwd.add(KernelKind::Copy, 2 * nh * e);
    if (c.position_embedding_type == models::PositionEmbedding::LearnedAbsolute) fwd.add(KernelKind::Copy, 3 * nh * e);
    if (c.hidden_dropout > 0) {
      fwd.add(KernelKind::Dropout, 6 * nh * e);
      bwd.add(KernelKind::Dropout, 5 * nh * e);
    }
    if (l.bf16 && l.gradient_accumulation_fusion) {
      // Fusion (autograd/functions/dropout_embedding.cpp): the rows made fp32 and added into the
      // fp32 table by atomics; only the output weight's gradient accumulated in a pass of its own.
      bwd.add(KernelKind::Copy, nh * (e + 4) + nh * 12 + as_double(v) * h * (e + 8));
    } else {
      bwd.add(KernelKind::Copy, as_double(v) * h * e + 2 * nh * e + 2 * as_double(v) * h * (e + 8));
    }
    // (Spread over every chunk, also under an uneven split: the stages' difference is their layers.)
    const double chunks = static_cast<double>(l.pp) * l.vpp;
    head_forward = (loss_f + fwd.seconds(table, mem_bw)) / chunks;
    head_backward = (loss_b + bwd.seconds(table, mem_bw)) / chunks;
    if (c.mtp_num_layers > 0) {
      // MTP on the last stage (models/multi_token_prediction.cpp), per depth: the embedding of the
      // shifted tokens, enorm and hnorm, their concatenation, eh_proj (2H -> H / tp, gathered), a
      // dense layer (with its tensor-parallel communication), the final norm, and the output layer's
      // loss as the main one.
      const std::int64_t h_out = c.hidden_size / l.tp;
      const double eh_f = table.gemm_seconds(tokens, h_out, 2 * c.hidden_size, p, peak);
      const double eh_b = table.gemm_seconds(tokens, 2 * c.hidden_size, h_out, p, peak) +
                          table.gemm_seconds(h_out, 2 * c.hidden_size, tokens, p, peak);
      Traffic mf, mb;
      mf.add(KernelKind::Copy, 2 * nh * e + 4 * nh * e);  // the embedding gather, the concatenation
      mf.add(KernelKind::Norm, 3 * 3 * nh * e);
      mb.add(KernelKind::Copy, 4 * nh * e + 2 * nh * e);  // the embedding's gradient, the split
      mb.add(KernelKind::Norm, 3 * 3 * nh * e);
      const double depths = as_double(c.mtp_num_layers);
      mtp_forward = depths * (dense.forward + dense.tp / 3 + eh_f + loss_f + mf.seconds(table, mem_bw));
      mtp_backward = depths * (dense.backward + 2 * dense.tp / 3 + eh_b + loss_b + mb.seconds(table, mem_bw));
    }
  }
  const Link pp_link = group_link(sys, l.pp, l.tp * l.cp * l.dp);
  const double p2p =
      l.pp > 1 ? send_recv_seconds(n * as_double(c.hidden_size) * e / (l.sequence_parallel ? l.tp : 1), pp_link) : 0;
  std::vector<StageTimes> stages;
  for (const std::int64_t layers : stage_layers) {
    StageTimes s = std::get<0>(chunk_times(layers));
    s.forward += head_forward;
    s.backward += head_backward;                     // (its weight-gradient fraction that of the layers)
    if (stages.size() + 1 == stage_layers.size()) {  // the last stage: MTP, spread over its chunks
      s.forward += mtp_forward / l.vpp;
      s.backward += mtp_backward / l.vpp;
    }
    s.p2p = p2p;
    stages.push_back(s);
  }
  st = stages[static_cast<std::size_t>(largest)];
  r.stage = st;
  r.layer = dense.parts;
  const int m = static_cast<int>(l.micro_batches());
  ScheduleKind kind = l.schedule;
  if (l.pp == 1) kind = ScheduleKind::OneF1B;
  if (kind == ScheduleKind::OneF1B && l.vpp > 1) kind = ScheduleKind::Interleaved;
  r.schedule = simulate_schedule(kind, l.pp, m, kind == ScheduleKind::Interleaved ? l.vpp : 1, stages);
  r.pipeline_seconds = r.schedule.makespan;

  // Memory: the worst stage (the first holds the most in flight, the last the logits).
  // Kiln's caching allocator (runtime/caching_allocator.cpp) is the same on every device: it rounds
  // each request to 512 B (counted per tensor) and splits its segments to that, so its allocated
  // peak is the requests'; no margin unless asked for.
  const double frag = o.fragmentation >= 0 ? o.fragmentation : 0.0;
  for (int s = 0; s < l.pp; ++s) {
    const int held = r.schedule.peak_in_flight.empty() ? 1 : r.schedule.peak_in_flight[static_cast<std::size_t>(s)];
    MemoryBreakdown mem = stage_memory(model, l, s, std::max(1, held), frag, /*host_device=*/sys.name == "cpu");
    if (kind == ScheduleKind::DualPipe && l.pp > 1) {
      // DualPipe: each device holds stage s of one direction and stage p-1-s of the other (two
      // copies of the weights); the activations above already count both directions.
      const MemoryBreakdown mirror = stage_memory(model, l, l.pp - 1 - s, 0, 0);
      mem.parameters += mirror.parameters;
      mem.gradients += mirror.gradients;
      mem.optimizer += mirror.optimizer;
      mem.fp8_copies += mirror.fp8_copies;
      mem.activations += mirror.activations;  // its embedding or logits buffers (no chunks)
      mem.transient = std::max(mem.transient, mirror.transient);
    }
    if (s == 0 || mem.peak() > r.memory.peak()) {
      r.memory = mem;
      r.worst_stage = s;
    }
  }
  r.memory_cap = sys.memory_bytes * o.memory_usable;

  // Data parallelism: gradients reduced (reduce-scatter + all-gather of parameters with the
  // distributed optimizer, all-reduce without) in buckets while the last micro-batch's backward
  // runs; what is left after it is exposed.
  const StageParameters params = stage_parameters(model, l, largest);
  const int dp_group = l.dp * l.cp;
  const Link dp_link = group_link(sys, dp_group, l.tp);
  const double grad_bytes = params.dense * 4;
  // --fp8-param-gather: the FP8 linears' weights are gathered as their fp8 bytes, 1 byte each.
  const double fp8_weights = model.config.fp8_param_gather ? stage_fp8_weight_elements(model, l, largest) : 0;
  const double param_bytes = (params.dense - fp8_weights) * (l.bf16 ? 2 : 4) + fp8_weights;
  double dp_comm = 0;
  if (dp_group > 1)
    dp_comm = l.distributed_optimizer ? reduce_scatter_seconds(grad_bytes, dp_group, dp_link) +
                                            all_gather_seconds(param_bytes, dp_group, dp_link)
                                      : all_reduce_seconds(grad_bytes, dp_group, dp_link);
  // The experts' data-parallel ranks: world / (etp x ep x pp), holding the same slices.
  const int edp = l.dp * l.cp * l.tp / std::max(1, l.ep * l.etp);
  if (params.expert > 0 && edp > 1) {
    const Link edp_link = group_link(sys, edp, l.ep * l.etp);
    dp_comm += l.distributed_optimizer ? 2 * reduce_scatter_seconds(params.expert * 4, edp, edp_link)
                                       : all_reduce_seconds(params.expert * 4, edp, edp_link);
  }
  const double overlap_window = st.backward * l.vpp;  // the last micro-batch's backward on a stage
  r.dp_exposed_seconds = std::max(dp_comm - overlap_window, dp_comm * 0.1);
  // The step: zero the fp32 gradient buffers (4 bytes per parameter), the non-finite check's sum
  // of squares (read 4: train/nonfinite_guard.cpp), the gradient norm and clip (read 4, then a read
  // and a write of 4: optim/clip_grad.cpp), FlatAdamW's fused kernel on this device's shard
  // (ops/cuda/optim.cu adam_step: reads the fp32 gradient, master and two moments, writes the
  // master and moments, and in bf16 the rounded parameter: 30 bytes per parameter, 28 in fp32
  // where the parameter is its own master); the clip launches one op per parameter tensor. One
  // process (no DataParallel in train/gpt_trainer.cpp) shares one sum of squares between the check
  // and the norm, and the clip's coefficient goes into AdamW's kernel: 4 + 4 bytes before AdamW.
  const double bw = cal && cal->memory_bandwidth > 0 ? cal->memory_bandwidth : 0.7 * sys.memory_bandwidth;
  const double shard =
      l.distributed_optimizer ? params.dense / dp_group + params.expert / std::max(1, edp) : params.total();
  const LayerWork one = layer_work(model, l, false);
  const double stage_layer_count = as_double(ranges[static_cast<std::size_t>(largest)].second) -
                                   as_double(ranges[static_cast<std::size_t>(largest)].first);
  const double tensors = one.parameter_tensors * stage_layer_count + 4;
  const double before_adam = l.devices() == 1 ? 4 + 4 : 4 + 4 + 12;
  r.optimizer_seconds =
      (params.total() * before_adam + shard * (l.bf16 ? 30.0 : 28.0)) / bw + (cal ? cal->op_overhead : 0) * 2 * tensors;
  if (l.fp8) {
    // FP8 weights are cast once per optimizer step, on the first micro-batch's forward
    // (te/fp8_weight_cache.h): the rowwise and the columnwise cast of each in one pass (read the
    // bf16 weight, write two bytes; blockwise casts write the same bytes in 128 x 128 tiles).
    const LayerWork dense_work = layer_work(model, l, false);
    const LayerWork moe_work = model.moe.enabled() ? layer_work(model, l, true) : dense_work;
    const double weights =
        stage_layer_count * ((1 - moe_share) * dense_work.fp8_weights + moe_share * moe_work.fp8_weights);
    r.optimizer_seconds += weights * ((l.bf16 ? 2 : 4) + 2) / bw;
  }
  r.step_seconds = r.pipeline_seconds + r.dp_exposed_seconds + r.optimizer_seconds;
  const double tokens = as_double(l.global_batch_size) * as_double(c.seq_length);
  r.tokens_per_second = tokens / r.step_seconds;
  // MFU against the peak of the GEMMs' precision (FP8 runs against the FP8 peak).
  const Precision p = l.fp8 ? Precision::FP8 : (l.bf16 ? Precision::BF16 : Precision::FP32);
  r.mfu = model_flops_per_token(model) * r.tokens_per_second / l.devices() / sys.peak_flops(p);
  if (!r.fits())
    r.invalid.push_back(fmt::format("needs {:.1f} GiB on stage {}, the cap is {:.1f} GiB",
                                    r.memory.peak() / 1073741824.0, r.worst_stage, r.memory_cap / 1073741824.0));
  return r;
}

}  // namespace kiln::sim
