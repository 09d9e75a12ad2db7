// `kiln simulate`: predicts the step time and memory of a `kiln pretrain-gpt` run (the same flags)
// under a parallel layout (Megatron's flags) on a system (built in or a JSON file), measures a
// system with --calibrate, searches every layout with --search, draws a schedule with --timeline.
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <set>

#include "commands.h"
#include "kiln/io/atomic_file.h"
#include "kiln/runtime/backend.h"
#include "kiln/sim/calibration.h"
#include "kiln/sim/layout_search.h"
#include "kiln/sim/simulator.h"
#include "kiln/sim/timeline_plot.h"
#include "number_checks.h"
#include "pretrain_gpt_flags.h"

namespace kiln::cli {

namespace {

struct SimulateFlags {
  PretrainGptFlags gpt;
  std::string system;
  int nodes = 0, gpus_per_node = 0, gpus = 0;
  std::string calibration;
  bool calibrate = false;
  bool quick = false;
  bool search = false;
  int top = 15;
  std::string pipeline_schedule = "1f1b";
  std::string timeline;
  double fragmentation = -1;
};

double mib(double bytes) { return bytes / 1048576.0; }

void print_prediction(const sim::ModelSpec& model, const sim::Prediction& p, const sim::SystemSpec& system) {
  const auto& m = p.memory;
  fmt::print("layout: {} on {} x {}\n", p.layout.describe(), p.layout.devices(), system.name);
  fmt::print(
      "predicted: elapsed time per iteration (ms): {:.1f} | tokens/s: {:.0f} | MFU: {:.1f}% | pipeline {:.1f} ms "
      "(bubble {:.1f}%), data-parallel exposed {:.1f} ms, optimizer {:.1f} ms\n",
      p.step_seconds * 1e3, p.tokens_per_second, 100 * p.mfu, p.pipeline_seconds * 1e3,
      100 * p.schedule.bubble_fraction, p.dp_exposed_seconds * 1e3, p.optimizer_seconds * 1e3);
  fmt::print(
      "one micro-batch through one chunk: forward {:.2f} ms, backward {:.2f} ms (weight gradients {:.0f}%), "
      "TP {:.2f} ms, EP {:.2f} ms, CP exposed {:.2f} ms, p2p {:.3f} ms\n",
      p.stage.forward * 1e3, p.stage.backward * 1e3, 100 * p.stage.weight_fraction, p.tp_seconds_per_chunk * 1e3,
      p.ep_seconds_per_chunk * 1e3, p.cp_exposed_per_chunk * 1e3, p.stage.p2p * 1e3);
  const auto& y = p.layer;
  fmt::print(
      "one layer and micro-batch (forward / backward, ms): GEMMs {:.3f} / {:.3f}, {} attention {:.3f} / {:.3f}, "
      "memory-bound kernels {:.3f} / {:.3f}, gradient accumulation {:.3f}, host dispatch {:.3f} / {:.3f}\n",
      y.gemm_forward * 1e3, y.gemm_backward * 1e3, y.unfused_attention ? "unfused" : "fused", y.attention_forward * 1e3,
      y.attention_backward * 1e3, y.memory_bound_forward * 1e3, y.memory_bound_backward * 1e3,
      y.gradient_accumulation * 1e3, y.host_forward * 1e3, y.host_backward * 1e3);
  fmt::print(
      "predicted mem peak (MiB): {:.1f} on stage {} = parameters {:.1f} + gradients {:.1f} + optimizer {:.1f} + fp8 "
      "{:.1f} + activations {:.1f} + backward temporaries {:.1f} + batch/tables {:.1f} + fragmentation {:.1f} (cap "
      "{:.0f})\n",
      mib(m.peak()), p.worst_stage, mib(m.parameters), mib(m.gradients), mib(m.optimizer), mib(m.fp8_copies),
      mib(m.activations), mib(m.transient), mib(m.other), mib(m.fragmentation), mib(p.memory_cap));
  for (const auto& why : p.invalid) fmt::print("cannot run: {}\n", why);
  if (p.invalid.empty()) fmt::print("kiln pretrain-gpt flags: {}\n", sim::megatron_flags(model, p.layout));
}

}  // namespace

void add_simulate(CLI::App& app) {
  auto f = std::make_shared<SimulateFlags>();
  auto* cmd = app.add_subcommand(
      "simulate",
      "Predict the step time and memory of a pretrain-gpt run under a parallel layout, or search layouts "
      "(docs/simulate.md)");
  cmd->footer(
      "Takes pretrain-gpt's flags unchanged (data and learning rate optional) plus Megatron's layout flags.\n"
      "  kiln simulate --calibrate --calibration cpu.json\n"
      "  kiln simulate <pretrain-gpt flags> --system cpu --calibration cpu.json\n"
      "  kiln simulate <model flags> --system h200 --nodes 8 --search --global-batch-size 512\n"
      "See docs/simulate.md.");
  add_pretrain_gpt_flags(cmd, f->gpt, GptFlagsFor::Simulate);
  const char* g = "Simulation";
  cmd->add_option("--system", f->system,
                  "h200, h100-sxm, a100-80gb, b200, cpu, or a JSON file (default: cpu, or h200 with a GPU)")
      ->group(g);
  cmd->add_option("--nodes", f->nodes, "nodes (overrides the system's)")->check(whole_number_at_least(1))->group(g);
  cmd->add_option("--gpus-per-node", f->gpus_per_node, "devices per node (overrides the system's)")
      ->check(whole_number_at_least(1))
      ->group(g);
  cmd->add_option("--gpus", f->gpus, "devices of the job (default: nodes x gpus per node)")
      ->check(whole_number_at_least(1))
      ->group(g);
  cmd->add_option("--calibration", f->calibration,
                  "the table --calibrate wrote (GEMM, attention, memory bandwidth); without it: the roofline")
      ->group(g);
  cmd->add_flag("--calibrate", f->calibrate,
                "measure this machine (--device) through Kiln's ops and write the table to --calibration")
      ->group(g);
  cmd->add_flag("--calibrate-quick", f->quick, "with --calibrate: a few small shapes only")->group(g);
  cmd->add_flag("--search", f->search, "rank every valid layout of --gpus by tokens/s under the memory cap")->group(g);
  cmd->add_option("--top", f->top, "layouts shown by --search")->check(whole_number_at_least(1))->group(g);
  cmd->add_option("--pipeline-schedule", f->pipeline_schedule, "1f1b, interleaved, zero-bubble or dualpipe")
      ->check(CLI::IsMember({"1f1b", "interleaved", "zero-bubble", "dualpipe"}))
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--timeline", f->timeline, "draw the layout's (with --search: the best's) schedule to a PNG")
      ->group(g);
  cmd->add_option(
         "--memory-fragmentation", f->fragmentation,
         "fraction of activations added for allocator fragmentation (default 0: the rounding is counted per tensor)")
      ->check(finite_number_above(0, true))
      ->group(g);

  cmd->callback([f, cmd] {
    auto& gf = f->gpt;
    if (f->calibrate) {
      if (f->calibration.empty())
        throw CLI::ValidationError("--calibrate", "give --calibration FILE: where the measured table goes");
      sim::CalibrateOptions co;
      co.device = gf.device.empty() ? Device::cpu() : Device::parse(gf.device);
      co.quick = f->quick;
      co.precisions = {sim::Precision::FP32, sim::Precision::BF16};  // bf16 on the CPU: what --bf16 runs there
      const sim::CalibrationTable table = sim::calibrate(co);
      sim::save_calibration(table, f->calibration);
      fmt::print(
          "calibrated {}: {} GEMM shapes, {} attention shapes, {} op samples, {} GELU MLP shapes, memory bandwidth "
          "{:.1f} GB/s -> {}\n",
          table.device, table.gemms.size(), table.attention.size(), table.ops.size(), table.gelu_mlp.size(),
          table.memory_bandwidth / 1e9, f->calibration);
      for (const auto& op : table.ops)
        fmt::print(
            "  op {:<20} {:<4} forward {:7.2f} us + {:8.3f} ns/element, backward {:7.2f} us + {:8.3f} ns/element\n",
            sim::to_string(op.kind), sim::to_string(op.precision), op.forward.fixed * 1e6, op.forward.per_element * 1e9,
            op.backward.fixed * 1e6, op.backward.per_element * 1e9);
      if (cmd->count("--num-layers") == 0) return;
    }
    resolve_pretrain_gpt_flags(cmd, gf, GptFlagsFor::Simulate);
    sim::ModelSpec model;
    model.config = gf.config;
    const auto& lf = gf.layout;
    model.moe = sim::MoeSpec::of(model.config);

    const bool has_gpu = device_count(DeviceKind::CUDA) > 0;
    sim::SystemSpec system = sim::load_system(f->system.empty() ? (has_gpu ? "h200" : "cpu") : f->system);
    if (f->nodes > 0) system.nodes = f->nodes;
    if (f->gpus_per_node > 0) system.gpus_per_node = f->gpus_per_node;
    const int devices = f->gpus > 0 ? f->gpus : system.total_devices();
    if (devices > system.total_devices())
      throw CLI::ValidationError("--gpus", fmt::format("{} is more than the system's {} nodes x {} devices", devices,
                                                       system.nodes, system.gpus_per_node));
    std::optional<sim::CalibrationTable> table;
    if (!f->calibration.empty()) {
      table = sim::load_calibration(f->calibration);
      const sim::Precision p = gf.options.bf16 ? sim::Precision::BF16 : sim::Precision::FP32;
      if (!table->has_ops(p))
        fmt::print(
            "note: {} has no op samples for {} (a table from before 2026-12-05): transformer_engine layers' "
            "memory-bound kernels are priced by their bytes (the older model); `kiln simulate --calibrate` "
            "measures them\n",
            f->calibration, sim::to_string(p));
    }
    sim::PredictOptions po;
    po.fragmentation = f->fragmentation;
    const auto& o = gf.options;
    const std::int64_t gbs = o.effective_global_batch();
    const sim::ScheduleKind schedule = sim::parse_schedule(f->pipeline_schedule);

    auto draw = [&](const sim::Prediction& p) {
      if (f->timeline.empty()) return;
      sim::write_timeline_png(p.schedule, p.layout.pp, fmt::format("{}: {}", system.name, p.layout.describe()),
                              f->timeline);
      fmt::print("timeline: {}\n", f->timeline);
    };

    if (f->search) {
      sim::SearchOptions so;
      so.devices = devices;
      so.global_batch_size = gbs;
      so.bf16 = o.bf16;
      so.gradient_accumulation_fusion = o.gradient_accumulation_fusion;
      so.schedule = schedule;
      so.predict = po;
      const sim::SearchResult r = sim::search_layouts(model, system, table ? &*table : nullptr, so);
      fmt::print("{} layouts of {} devices on {} ({} x {} per node): {} fit, {} cannot run\n",
                 r.ranked.size() + r.rejected.size(), devices, system.name, system.nodes, system.gpus_per_node,
                 r.ranked.size(), r.rejected.size());
      fmt::print("{:>4}  {:<48} {:>12} {:>10} {:>7} {:>10} {:>8}\n", "rank", "layout", "tokens/s", "step ms", "MFU",
                 "peak GiB", "bubble");
      for (std::size_t i = 0; i < r.ranked.size() && i < static_cast<std::size_t>(f->top); ++i) {
        const auto& p = r.ranked[i];
        fmt::print("{:>4}  {:<48} {:>12.0f} {:>10.1f} {:>6.1f}% {:>10.2f} {:>7.1f}%\n", i + 1, p.layout.describe(),
                   p.tokens_per_second, p.step_seconds * 1e3, 100 * p.mfu, p.memory.peak() / 1073741824.0,
                   100 * p.schedule.bubble_fraction);
      }
      // A sample of the refusals, one per distinct first reason.
      std::set<std::string> shown;
      for (const auto& p : r.rejected) {
        const std::string why = p.invalid.front().substr(0, p.invalid.front().find(" on stage"));
        const std::string key = why.substr(0, why.find_first_of("0123456789"));
        if (shown.insert(key).second && shown.size() <= 6)
          fmt::print("not ranked, e.g. {}: {}\n", p.layout.describe(), p.invalid.front());
      }
      if (r.ranked.empty()) {
        fmt::print("no layout fits: more devices, a smaller model, or a smaller --global-batch-size\n");
        return;
      }
      fmt::print("best: kiln pretrain-gpt <model and data flags> {}\n",
                 sim::megatron_flags(model, r.ranked.front().layout));
      if (!f->timeline.empty())
        draw(sim::predict(model, r.ranked.front().layout, system, table ? &*table : nullptr, po));
      return;
    }

    sim::Layout l;
    l.tp = lf.tensor_model_parallel_size;
    l.pp = lf.pipeline_model_parallel_size;
    l.cp = lf.context_parallel_size;
    l.ep = lf.expert_model_parallel_size;
    l.etp = lf.expert_tensor_parallel_size;
    l.first_stage_layers = lf.decoder_first_pipeline_num_layers;
    l.last_stage_layers = lf.decoder_last_pipeline_num_layers;
    l.tp_comm_overlap = lf.tp_comm_overlap;
    l.cp_comm_type = lf.cp_comm_type == "a2a" ? models::CpCommType::A2A : models::CpCommType::P2P;
    l.moe_token_dispatcher = lf.moe_token_dispatcher_type == "allgather" ? models::MoeTokenDispatcher::AllGather
                                                                         : models::MoeTokenDispatcher::AllToAll;
    const int model_parallel = l.tp * l.pp * l.cp;
    if (devices % model_parallel != 0)
      throw CLI::ValidationError(
          "--gpus", fmt::format("{} devices are not a multiple of TP x PP x CP = {}", devices, model_parallel));
    l.dp = devices / model_parallel;
    if (lf.num_layers_per_virtual_pipeline_stage > 0) {
      const std::int64_t per_stage = model.config.num_layers / l.pp;
      if (per_stage % lf.num_layers_per_virtual_pipeline_stage != 0)
        throw CLI::ValidationError("--num-layers-per-virtual-pipeline-stage",
                                   fmt::format("{} does not divide the {} layers of a pipeline stage",
                                               lf.num_layers_per_virtual_pipeline_stage, per_stage));
      l.vpp = static_cast<int>(per_stage / lf.num_layers_per_virtual_pipeline_stage);
    }
    l.sequence_parallel = lf.sequence_parallel;
    l.distributed_optimizer = lf.use_distributed_optimizer;
    l.fp8 = model.config.fp8;  // --fp8-format (and --fp8-recipe: model.config.fp8_recipe)
    l.bf16 = o.bf16;
    l.gradient_accumulation_fusion = o.gradient_accumulation_fusion;
    l.micro_batch_size = o.micro_batch_size;
    l.global_batch_size = gbs;
    l.recompute = model.config.recompute_granularity;
    l.schedule = l.vpp > 1 && schedule == sim::ScheduleKind::OneF1B ? sim::ScheduleKind::Interleaved : schedule;
    const sim::Prediction p = sim::predict(model, l, system, table ? &*table : nullptr, po);
    if (!p.invalid.empty() && p.step_seconds == 0) {
      fmt::print("layout {} cannot run:\n", l.describe());
      for (const auto& why : p.invalid) fmt::print("  {}\n", why);
      throw CLI::ValidationError("--tensor-model-parallel-size", "the layout cannot run (reasons above)");
    }
    print_prediction(model, p, system);
    draw(p);
  });
}

}  // namespace kiln::cli
