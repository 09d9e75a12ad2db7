#pragma once
// Pipeline schedules simulated event by event: each device runs its forward (F), backward (B)
// and, where the schedule splits the backward, weight-gradient (W) passes as soon as their inputs
// have arrived (the previous stage's F, the next stage's B, plus the point-to-point time) and the
// device is free. The result is every pass's start and end, so the step time, the bubble and the
// activations held at any moment (forwards done minus backwards done) come out of the same run.
//
//   OneF1B       Megatron's 1F1B: p - s - 1 warm-up forwards on stage s, then one F one B.
//   Interleaved  Megatron's interleaved 1F1B: v model chunks per device, in Megatron's order.
//   ZeroBubble   ZB-H1 (Qi et al. 2023): 1F1B whose backward is split; the W passes fill the
//                device's idle time, in the fixed order the training loop runs
//                (pipeline_actions.h: zero_bubble_actions; at most p micro-batches' activations
//                held per device, 1F1B's peak).
//   DualPipe     DeepSeek-V3's bidirectional pipeline: half the micro-batches enter at each end,
//                each device holds stage s of one direction and stage p-1-s of the other, B
//                before F, W deferred into idle time (at most p + 1 chunks' activations per device);
//                the training loop runs this order, made with nominal times (dualpipe_actions below).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/sim/pipeline_actions.h"

namespace kiln::sim {

enum class ScheduleKind { OneF1B, Interleaved, ZeroBubble, DualPipe };
std::string_view to_string(ScheduleKind k);
ScheduleKind parse_schedule(std::string_view s);  // 1f1b, interleaved, zero-bubble, dualpipe

// Durations of one micro-batch's passes through one model chunk on one device.
struct StageTimes {
  double forward = 0;
  double backward = 0;         // the whole backward (input and weight gradients)
  double weight_fraction = 0;  // the part of `backward` that is the weight gradient (W)
  double p2p = 0;              // sending one micro-batch's activations to the next stage
};

enum class PassKind { F, B, W };

struct Pass {
  PassKind kind;
  int device = 0;
  int micro_batch = 0;
  int chunk = 0;      // model chunk on the device (interleaved), or direction (DualPipe)
  int direction = 0;  // DualPipe: 0 enters at device 0, 1 at device p-1
  double start = 0, end = 0;
};

struct ScheduleResult {
  std::vector<Pass> passes;  // in the order they were scheduled
  double makespan = 0;
  // Idle fraction of the devices' time until the makespan.
  double bubble_fraction = 0;
  // Per device: the most micro-batch chunks whose forward was done and backward not yet (the
  // activations held at the worst moment), in units of one chunk's activations.
  std::vector<int> peak_in_flight;
};

// p devices, m micro-batches, v chunks per device (1 unless Interleaved). Throws kiln::Error
// naming the flag when the schedule cannot run these sizes (interleaving needs m % p == 0;
// DualPipe an even m and an even p).
ScheduleResult simulate_schedule(ScheduleKind kind, int p, int m, int v, const StageTimes& times);
// The same with each pipeline stage's own times (`per_stage[s]`, p of them): an uneven split of the
// layers (--decoder-first/last-pipeline-num-layers) makes stages differ. Stage s runs on device s; under
// DualPipe direction 1 runs it on device p - 1 - s, so a device takes both its stages' times. Its
// point-to-point time is the sending stage's. Equal entries give simulate_schedule(..., times).
ScheduleResult simulate_schedule(ScheduleKind kind, int p, int m, int v, const std::vector<StageTimes>& per_stage);

// DualPipe's order, one source for `kiln simulate` and `kiln pretrain-gpt --pipeline-schedule
// dualpipe`: the simulator's DualPipe run with `times` (each device, whenever it is free, takes the
// pass that can start first: the oldest backward (B) whose gradient has arrived, else the next
// forward of a direction whose input has arrived while fewer than p - s micro-batches of that
// direction hold activations on it (s: its stage in that direction, 1F1B's warm-up; so p + 1 at
// most per device), else its oldest weight-gradient pass (W) in what would be idle time), as each
// device's list of actions: `chunk` is the direction (0: micro-batches 0 .. m/2 - 1 from device 0,
// 1: m/2 .. m - 1 from device p - 1), `micro_batch` the global index; 3 m actions per device. The
// lists come from one feasible run, so ranks that wait for their inputs cannot deadlock.
// Throws naming the flags unless p and m are even (check_dualpipe_sizes).
std::vector<std::vector<PipelineAction>> dualpipe_schedule_actions(int p, int m, const StageTimes& times);
// The times training orders its passes by (it runs before anything is measured): F = B = W, free
// point-to-point (ZB-H1's assumption); simulate_schedule(DualPipe, ...) with them times this order.
StageTimes dualpipe_nominal_times();
// Rank `rank`'s list with the nominal times: what the training loop's executor runs.
std::vector<PipelineAction> dualpipe_actions(int rank, int p, int m);

}  // namespace kiln::sim
