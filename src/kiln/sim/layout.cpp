#include "kiln/sim/layout.h"

#include <fmt/format.h>

#include "kiln/models/gpt_pipeline_stage.h"
#include "kiln/runtime/error.h"

namespace kiln::sim {

std::int64_t MoeSpec::moe_layers(std::int64_t num_layers) const {
  if (!enabled()) return 0;
  return (num_layers + layer_freq - 1) / layer_freq;  // layers 0, freq, 2 freq, ... (Megatron's int form)
}

MoeSpec MoeSpec::of(const models::GptConfig& c) {
  MoeSpec m;
  m.num_experts = c.num_experts;
  m.router_topk = c.moe_router_topk;
  m.ffn_hidden_size = c.moe_ffn_hidden_size;
  m.shared_expert_ffn_size = c.moe_shared_expert_intermediate_size;
  m.layer_freq = c.moe_layer_pattern.empty() ? c.moe_layer_freq : 1;  // a 0/1 list: counted as all MoE
  return m;
}

namespace {

bool uneven_split(const Layout& l) { return l.first_stage_layers > 0 || l.last_stage_layers > 0; }

}  // namespace

std::vector<std::pair<std::int64_t, std::int64_t>> stage_layer_ranges(const ModelSpec& model, const Layout& l) {
  const std::int64_t layers = model.config.num_layers;
  // pretrain-gpt's own split (and its refusals: interleaving with an uneven split, a rest that the
  // middle stages do not share evenly), so that simulate runs the layers where training would.
  const auto chunks = models::pipeline_layer_ranges(
      layers, models::PipelineSplit{.stages = l.pp,
                                    .layers_per_virtual_stage = l.vpp > 1 ? layers / (l.pp * l.vpp) : 0,
                                    .first_stage_layers = l.first_stage_layers,
                                    .last_stage_layers = l.last_stage_layers});
  if (l.vpp == 1) return chunks;
  // A device holds every pp-th chunk: counted as its share of the layers in one block (the same
  // number of layers; the mix of dense and MoE layers the same on average).
  std::vector<std::pair<std::int64_t, std::int64_t>> stages;
  const std::int64_t per_stage = layers / l.pp;
  for (std::int64_t s = 0; s < l.pp; ++s) stages.emplace_back(s * per_stage, (s + 1) * per_stage);
  return stages;
}

std::string Layout::describe() const {
  std::string s = fmt::format("TP{} PP{}", tp, pp);
  if (vpp > 1) s += fmt::format(" VPP{}", vpp);
  if (first_stage_layers > 0) s += fmt::format(" first{}", first_stage_layers);  // layers of an uneven split
  if (last_stage_layers > 0) s += fmt::format(" last{}", last_stage_layers);
  s += fmt::format(" DP{} EP{}", dp, ep);
  if (etp > 1) s += fmt::format(" ETP{}", etp);
  s += fmt::format(" CP{} mbs{}", cp, micro_batch_size);
  if (sequence_parallel) s += " SP";
  if (tp_comm_overlap) s += " tp-comm-overlap";
  if (cp > 1 && cp_comm_type == models::CpCommType::A2A) s += " cp-a2a";
  if (ep > 1 && moe_token_dispatcher == models::MoeTokenDispatcher::AllGather) s += " allgather";
  if (distributed_optimizer) s += " distopt";
  if (fp8) s += " fp8";
  if (recompute != models::RecomputeGranularity::None) s += fmt::format(" rc-{}", models::to_string(recompute));
  if (pp > 1 && schedule != ScheduleKind::OneF1B && schedule != ScheduleKind::Interleaved)
    s += fmt::format(" {}", to_string(schedule));
  return s;
}

std::vector<std::string> check_layout(const ModelSpec& model, const Layout& l, int devices, bool system_has_fp8) {
  const auto& c = model.config;
  std::vector<std::string> why;
  auto need = [&](bool ok, std::string reason) {
    if (!ok) why.push_back(std::move(reason));
  };
  need(l.tp >= 1 && l.pp >= 1 && l.dp >= 1 && l.ep >= 1 && l.etp >= 1 && l.cp >= 1 && l.vpp >= 1,
       "every size must be at least 1");
  if (!why.empty()) return why;
  need(l.devices() == devices, fmt::format("TP {} x PP {} x CP {} x DP {} = {} devices, not the {} given", l.tp, l.pp,
                                           l.cp, l.dp, l.devices(), devices));
  need(c.num_attention_heads % l.tp == 0,
       fmt::format("--num-attention-heads {} is not a multiple of --tensor-model-parallel-size {}",
                   c.num_attention_heads, l.tp));
  need(c.query_groups() % l.tp == 0, fmt::format("--num-query-groups {} is not a multiple of "
                                                 "--tensor-model-parallel-size {}",
                                                 c.query_groups(), l.tp));
  need(c.ffn_hidden() % l.tp == 0,
       fmt::format("--ffn-hidden-size {} is not a multiple of --tensor-model-parallel-size {}", c.ffn_hidden(), l.tp));
  if (!uneven_split(l)) {
    need(c.num_layers % (static_cast<std::int64_t>(l.pp) * l.vpp) == 0,
         fmt::format("--num-layers {} is not a multiple of pipeline stages x virtual stages ({} x {})", c.num_layers,
                     l.pp, l.vpp));
  } else {
    // pretrain-gpt's refusals of the uneven split, its messages naming the flags (one stage;
    // interleaving, which needs equal chunks; a rest the other stages cannot share evenly).
    need(l.first_stage_layers >= 0 && l.last_stage_layers >= 0,
         "--decoder-first/last-pipeline-num-layers must be at least 1");
    try {
      (void)stage_layer_ranges(model, l);
    } catch (const Error& e) {
      why.push_back(e.what());
    }
  }
  need(l.vpp == 1 || l.pp > 1, "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1");
  need(c.seq_length % (2 * l.cp) == 0 || l.cp == 1,
       fmt::format("--seq-length {} is not a multiple of 2 x --context-parallel-size {} (causal load balancing)",
                   c.seq_length, l.cp));
  need(!l.sequence_parallel || l.tp > 1, "--sequence-parallel needs --tensor-model-parallel-size > 1");
  need(!l.tp_comm_overlap || l.sequence_parallel, "--tp-comm-overlap needs --sequence-parallel");
  // Ulysses (--cp-comm-type a2a) splits each tensor-parallel rank's heads and query groups over the group.
  need(l.cp_comm_type != models::CpCommType::A2A || l.cp == 1 ||
           ((c.num_attention_heads / l.tp) % l.cp == 0 && (c.query_groups() / l.tp) % l.cp == 0),
       fmt::format("--cp-comm-type a2a: the heads ({}) and query groups ({}) per tensor-parallel rank must be "
                   "multiples of --context-parallel-size {}",
                   c.num_attention_heads / l.tp, c.query_groups() / l.tp, l.cp));
  need(!l.tp_comm_overlap || !l.fp8, "--tp-comm-overlap with FP8 is not supported (pretrain-gpt refuses it)");
  need(l.global_batch_size % (l.micro_batch_size * l.dp) == 0,
       fmt::format("--global-batch-size {} is not a multiple of --micro-batch-size {} x data-parallel size {}",
                   l.global_batch_size, l.micro_batch_size, l.dp));
  if (model.moe.enabled()) {
    need(model.moe.num_experts % l.ep == 0,
         fmt::format("--num-experts {} is not a multiple of --expert-model-parallel-size {}", model.moe.num_experts,
                     l.ep));
    need((static_cast<std::int64_t>(l.dp) * l.cp * l.tp) % l.ep == 0,
         fmt::format("--expert-model-parallel-size {} does not divide the {} devices of a pipeline stage", l.ep,
                     l.dp * l.cp * l.tp));
    // pretrain-gpt's refusals of expert tensor parallelism (gpt_config_parallel.cpp, cmd_pretrain_gpt.cpp).
    const std::int64_t fe = model.expert_ffn_hidden();
    need(fe % l.etp == 0,
         fmt::format("the experts' hidden size ({}, --moe-ffn-hidden-size or --ffn-hidden-size) is not a multiple "
                     "of --expert-tensor-parallel-size {}",
                     fe, l.etp));
    need((static_cast<std::int64_t>(l.dp) * l.cp * l.tp) % (static_cast<std::int64_t>(l.etp) * l.ep) == 0,
         fmt::format("--expert-tensor-parallel-size {} x --expert-model-parallel-size {} does not divide the {} "
                     "devices of a pipeline stage (the experts' ranks are etp x ep x edp x pp)",
                     l.etp, l.ep, l.dp * l.cp * l.tp));
    need(l.etp == 1 || !l.fp8,
         fmt::format("--fp8-format with --expert-tensor-parallel-size {} is not supported (pretrain-gpt refuses it)",
                     l.etp));
  } else {
    need(l.ep == 1, "--expert-model-parallel-size > 1 needs --num-experts");
    need(l.etp == 1, "--expert-tensor-parallel-size > 1 needs --num-experts");
  }
  need(!l.fp8 || system_has_fp8, "--fp8-format: the system has no FP8 units (peak_flops.fp8 is 0)");
  if (why.empty() && l.pp > 1) {
    const std::int64_t m = l.micro_batches();
    if (l.schedule == ScheduleKind::Interleaved && l.vpp > 1)
      need(m % l.pp == 0, fmt::format("the interleaved schedule needs the {} micro-batches per step to be a multiple "
                                      "of --pipeline-model-parallel-size {}",
                                      m, l.pp));
    if (l.schedule == ScheduleKind::DualPipe)
      need(m % 2 == 0 && l.pp % 2 == 0,
           fmt::format("dualpipe needs an even number of micro-batches (got {}) and an even pipeline size (got {})", m,
                       l.pp));
  }
  need(c.mtp_num_layers == 0 || l.schedule != ScheduleKind::DualPipe || l.pp == 1,
       "--mtp-num-layers does not combine with --pipeline-schedule dualpipe (pretrain-gpt refuses it)");
  need(l.schedule != ScheduleKind::Interleaved || l.vpp > 1 || l.pp == 1,
       "--pipeline-schedule interleaved needs --num-layers-per-virtual-pipeline-stage");
  return why;
}

std::string megatron_flags(const ModelSpec& model, const Layout& l) {
  std::string f = fmt::format("--tensor-model-parallel-size {} --pipeline-model-parallel-size {}", l.tp, l.pp);
  if (l.vpp > 1)
    f += fmt::format(" --num-layers-per-virtual-pipeline-stage {}", model.config.num_layers / (l.pp * l.vpp));
  if (l.first_stage_layers > 0) f += fmt::format(" --decoder-first-pipeline-num-layers {}", l.first_stage_layers);
  if (l.last_stage_layers > 0) f += fmt::format(" --decoder-last-pipeline-num-layers {}", l.last_stage_layers);
  if (l.cp > 1) f += fmt::format(" --context-parallel-size {}", l.cp);
  if (l.ep > 1) f += fmt::format(" --expert-model-parallel-size {}", l.ep);
  if (l.etp > 1) f += fmt::format(" --expert-tensor-parallel-size {}", l.etp);
  if (l.sequence_parallel) f += " --sequence-parallel";
  if (l.tp_comm_overlap) f += " --tp-comm-overlap";
  if (l.cp > 1 && l.cp_comm_type == models::CpCommType::A2A) f += " --cp-comm-type a2a";
  if (l.ep > 1 && l.moe_token_dispatcher == models::MoeTokenDispatcher::AllGather)
    f += " --moe-token-dispatcher-type allgather";
  if (l.distributed_optimizer) f += " --use-distributed-optimizer";
  if (l.fp8) f += " --fp8-format hybrid";
  if (l.bf16) f += " --bf16";
  f += fmt::format(" --micro-batch-size {} --global-batch-size {}", l.micro_batch_size, l.global_batch_size);
  if (l.recompute != models::RecomputeGranularity::None)
    f += fmt::format(" --recompute-granularity {}", models::to_string(l.recompute));
  if (l.recompute == models::RecomputeGranularity::Full) f += " --recompute-method uniform --recompute-num-layers 1";
  return f;
}

}  // namespace kiln::sim
