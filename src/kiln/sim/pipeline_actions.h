#pragma once
// The pipeline schedules as pure lists of actions per rank: what each pipeline rank runs, in order
// (forward or backward of micro-batch m through its model chunk c), with nothing about time or
// communication. One definition serves three users: the training loop's executor
// (train/pipeline_executor.h) runs a rank's list, the simulator (pipeline_schedule.h) times the
// lists, and the timeline drawing labels what it measured by them.
//
//   1F1B (v = 1)   Megatron's non-interleaved schedule: rank r runs min(p - r - 1, m) warm-up
//                  forwards, then one forward and one backward in turn, then the remaining backwards.
//   Interleaved    Megatron's interleaved 1F1B (v model chunks per rank; rank r holds virtual stages
//                  r, r + p, .., r + (v-1) p): forwards go in groups of p micro-batches chunk by chunk,
//                  (p - r - 1) * 2 + (v - 1) * p warm-up forwards (all of them when m == p).
//   Zero bubble    ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B's order of forwards
//                  and backwards, the backward split in two: B (Backward: the input gradient, sent to the
//                  previous stage at once) and W (BackwardWeight: the weight gradients, which nothing
//                  downstream waits for). W passes go where the rank would otherwise wait; see
//                  zero_bubble_actions for the rule.
//   DualPipe       DeepSeek-V3's bidirectional schedule (deepseek-ai/DualPipe): p even, m even. Rank r
//                  holds two model chunks: chunk 0 is stage r of direction 0 (micro-batches 0 .. m/2 - 1
//                  enter at rank 0 and leave at rank p - 1), chunk 1 is stage p - 1 - r of direction 1
//                  (micro-batches m/2 .. m - 1 enter at rank p - 1 and leave at rank 0). Backwards are
//                  split into B and W as in ZB-H1. Its lists come from a timed run
//                  (pipeline_schedule.h: dualpipe_actions), with PipelineAction's micro_batch the
//                  global index and chunk the direction.
//
// Virtual stage of chunk c on rank r: c * p + r. Its input comes from virtual stage c * p + r - 1
// (rank r - 1, or rank p - 1's chunk c - 1 when r is 0); its output goes to c * p + r + 1.
#include <cstdint>
#include <vector>

namespace kiln::sim {

// Backward: the whole backward in the 1F1B and interleaved lists; in the zero-bubble lists only its
// input-gradient part (B), the weight gradients being the micro-batch's BackwardWeight (W).
enum class ActionKind { Forward, Backward, BackwardWeight };

struct PipelineAction {
  ActionKind kind = ActionKind::Forward;
  int micro_batch = 0;
  int chunk = 0;
  bool operator==(const PipelineAction&) const = default;
};

// The actions of pipeline rank `rank` of `p`, for `m` micro-batches and `v` model chunks per rank
// (v = 1: 1F1B). Every micro-batch's forward and backward through every chunk, 2 m v actions.
// Throws kiln::Error naming the flags when the sizes cannot run: interleaving (v > 1) needs m to be
// a multiple of p (Megatron's rule, --global-batch-size / (--micro-batch-size x data-parallel size)
// against --pipeline-model-parallel-size).
std::vector<PipelineAction> pipeline_actions(int rank, int p, int m, int v);

// Every rank's list: pipeline_actions(r, p, m, v) for r = 0 .. p - 1.
std::vector<std::vector<PipelineAction>> pipeline_schedule_actions(int p, int m, int v);

// ZB-H1's actions for pipeline rank `rank` of `p` (one model chunk per rank), `m` micro-batches:
// every micro-batch's F, B and W, 3 m actions. The order is 1F1B's for F and B; the W passes are
// placed by running the ranks' lists on equal-length passes (F = B = W, free point-to-point): at each
// step a rank runs its next F or B when its input is there, else the oldest pending W; an F also
// waits (running a W instead) while p micro-batches hold activations on the rank (forward done,
// W not yet), the most 1F1B holds anywhere (its rank 0), which is ZB-H1's memory bound. With m >= p
// that reaches ZB-H1's step of m (F + B + W) + (p - 1)(F + B - W), against 1F1B's (m + p - 1)(F + B + W).
// The lists come from one feasible run, so ranks that wait for their inputs cannot deadlock.
std::vector<PipelineAction> zero_bubble_actions(int rank, int p, int m);
std::vector<std::vector<PipelineAction>> zero_bubble_schedule_actions(int p, int m);

// DualPipe's sizes: throws kiln::Error naming --pipeline-model-parallel-size and the micro-batches
// per step (--global-batch-size / (--micro-batch-size x data-parallel size)) with their values
// unless both are even (p = 1 passes: one stage has no second direction, the simulator runs 1F1B).
void check_dualpipe_sizes(int p, int m);

}  // namespace kiln::sim
