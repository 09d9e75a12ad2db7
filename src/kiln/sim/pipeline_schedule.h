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
//                before F, W deferred into idle time, in the fixed order the training loop runs
//                (pipeline_actions.h: dualpipe_actions; at most p + 1 chunks' activations per device).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

}  // namespace kiln::sim
