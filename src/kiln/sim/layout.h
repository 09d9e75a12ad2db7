#pragma once
// What is simulated: a model (models::GptConfig plus, for mixture-of-experts, the MoE flags), the
// batch, and a parallel layout with Megatron's names. check_layout() lists every reason a layout
// cannot run (sizes that do not divide, a feature the system lacks); an empty list means valid.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/models/gpt_config.h"
#include "kiln/sim/pipeline_schedule.h"

namespace kiln::sim {

// Megatron's MoE flags (--num-experts, --moe-router-topk, --moe-ffn-hidden-size,
// --moe-shared-expert-intermediate-size, --moe-layer-freq); num_experts 0: a dense model.
struct MoeSpec {
  std::int64_t num_experts = 0;
  std::int64_t router_topk = 2;
  std::int64_t ffn_hidden_size = 0;         // 0: the dense --ffn-hidden-size
  std::int64_t shared_expert_ffn_size = 0;  // 0: no shared expert
  std::int64_t layer_freq = 1;              // every layer_freq-th layer is MoE (the others dense)
  bool enabled() const { return num_experts > 0; }
  std::int64_t moe_layers(std::int64_t num_layers) const;
  // The MoE of a model's own flags (GptConfig's --num-experts, --moe-*), as `kiln simulate` reads them.
  static MoeSpec of(const models::GptConfig& c);
};

struct ModelSpec {
  models::GptConfig config;
  MoeSpec moe;
  // An expert's MLP width: --moe-ffn-hidden-size, else the dense --ffn-hidden-size.
  std::int64_t expert_ffn_hidden() const { return moe.ffn_hidden_size > 0 ? moe.ffn_hidden_size : config.ffn_hidden(); }
};

struct Layout {
  int tp = 1, pp = 1, dp = 1, ep = 1, cp = 1;
  // --expert-tensor-parallel-size: each routed expert's hidden size F split over etp ranks (the experts'
  // ranks etp x ep x edp x pp, as pretrain-gpt's process groups).
  int etp = 1;
  int vpp = 1;  // model chunks per device (from --num-layers-per-virtual-pipeline-stage)
  // An uneven split (--decoder-first/last-pipeline-num-layers): the first / last stage's layers, the
  // other stages sharing the rest evenly; 0: not given.
  std::int64_t first_stage_layers = 0, last_stage_layers = 0;
  bool sequence_parallel = false;
  bool tp_comm_overlap = false;  // --tp-comm-overlap: the SP collectives under the linears' GEMMs
  models::CpCommType cp_comm_type = models::CpCommType::P2P;                               // --cp-comm-type
  models::MoeTokenDispatcher moe_token_dispatcher = models::MoeTokenDispatcher::AllToAll;  // EP's dispatcher
  bool distributed_optimizer = false;
  bool fp8 = false;
  bool bf16 = true;
  // --no-gradient-accumulation-fusion clears it: bf16 linears' weight-gradient GEMMs add into the
  // fp32 gradient buffers themselves (autograd/grad_accumulation_fusion.h), so no accumulation pass.
  bool gradient_accumulation_fusion = true;
  std::int64_t micro_batch_size = 1;
  std::int64_t global_batch_size = 1;
  models::RecomputeGranularity recompute = models::RecomputeGranularity::None;
  ScheduleKind schedule = ScheduleKind::OneF1B;

  int devices() const { return tp * pp * dp * cp; }
  // Micro-batches one data-parallel rank runs per step.
  std::int64_t micro_batches() const { return global_batch_size / (micro_batch_size * dp); }
  std::string describe() const;  // "TP2 PP4 VPP2 DP8 EP1 CP1 mbs1 SP distopt"
};

// Each pipeline stage's layers [begin, end) as pretrain-gpt splits them (models::pipeline_layer_ranges:
// the uneven split's first and last stages, the rest even); with virtual stages, the device's share
// of the layers as one block (num_layers / pp of them). Throws kiln::Error naming the flags where
// check_layout would refuse the split.
std::vector<std::pair<std::int64_t, std::int64_t>> stage_layer_ranges(const ModelSpec& model, const Layout& layout);

// Every reason `layout` cannot run `model` on `devices` devices; empty: valid.
std::vector<std::string> check_layout(const ModelSpec& model, const Layout& layout, int devices, bool system_has_fp8);

// The `kiln pretrain-gpt` flags (Megatron's names) that select this layout.
std::string megatron_flags(const ModelSpec& model, const Layout& layout);

}  // namespace kiln::sim
