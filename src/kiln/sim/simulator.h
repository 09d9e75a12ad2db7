#pragma once
// predict(): one training step of a layout on a system. Per layer and micro-batch, the GEMMs,
// attention and memory-bound kernels take their time from the calibration table (roofline where
// none); tensor-parallel (all-reduce, or all-gather + reduce-scatter with SP), context-parallel
// (ring of K/V blocks, overlapped with attention) and expert-parallel (all-to-all) communication
// add to the stage's passes; the pipeline schedule is simulated event by event; the data-parallel
// gradient reduction overlaps the backward except its last bucket; the optimizer step follows.
// Memory is the worst pipeline stage's (memory_model.h).
#include <optional>
#include <string>
#include <vector>

#include "kiln/sim/calibration.h"
#include "kiln/sim/layout.h"
#include "kiln/sim/memory_model.h"
#include "kiln/sim/pipeline_schedule.h"
#include "kiln/sim/system_spec.h"

namespace kiln::sim {

struct PredictOptions {
  // Fraction of activations added for the caching allocator's fragmentation; < 0: none (Kiln's
  // allocator rounds each request to 512 B and splits its blocks to it, on every device: counted
  // per tensor).
  double fragmentation = -1;
  // Usable fraction of the device memory (the rest: CUDA context, NCCL buffers).
  double memory_usable = 0.95;
};

// One dense layer and micro-batch on one device, by part (seconds): what the pass times are made of.
struct LayerTimes {
  double gemm_forward = 0, gemm_backward = 0;                  // the four linear layers
  double attention_forward = 0, attention_backward = 0;        // core attention (flash or unfused)
  double memory_bound_forward = 0, memory_bound_backward = 0;  // norms, residuals, dropout, casts, ...
  double gradient_accumulation = 0;                            // into the fp32 buffers, per micro-batch
  double host_forward = 0, host_backward = 0;                  // recording and launching the ops
  bool unfused_attention = false;
};

struct Prediction {
  Layout layout;
  std::vector<std::string> invalid;  // reasons it cannot run; empty: valid
  double step_seconds = 0;
  double tokens_per_second = 0;  // the whole job's
  double mfu = 0;                // model FLOPs per second per device / peak
  double pipeline_seconds = 0, dp_exposed_seconds = 0, optimizer_seconds = 0;
  StageTimes stage;  // one micro-batch through one chunk
  LayerTimes layer;  // one dense layer of it
  double tp_seconds_per_chunk = 0, ep_seconds_per_chunk = 0, cp_exposed_per_chunk = 0;
  ScheduleResult schedule;
  MemoryBreakdown memory;  // the worst stage's
  int worst_stage = 0;
  double memory_cap = 0;
  bool fits() const { return memory.peak() <= memory_cap; }
};

// Model FLOPs per token of a step (forward and backward, no recompute), with MoE's routed experts.
double model_flops_per_token(const ModelSpec& model);

Prediction predict(const ModelSpec& model, const Layout& layout, const SystemSpec& system,
                   const CalibrationTable* calibration, const PredictOptions& options = {});

}  // namespace kiln::sim
