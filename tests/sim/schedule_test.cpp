// The pipeline schedule simulator against the closed forms: 1F1B's bubble is (p-1)/(m+p-1), the
// interleaved schedule's (p-1)/(v m + p-1); zero-bubble and DualPipe idle less than 1F1B; every
// pass runs once, after its inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "kiln/runtime/error.h"
#include "kiln/sim/pipeline_schedule.h"

namespace kiln::sim {
namespace schedule_test {

StageTimes times(double f, double b, double w = 0, double p2p = 0) { return {f, b, w, p2p}; }

TEST(PipelineSchedule, OneF1BBubbleIsPMinusOneOverMPlusPMinusOne) {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 4, 8, 16}) {
      const ScheduleResult r = simulate_schedule(ScheduleKind::OneF1B, p, m, 1, times(1.0, 2.0));
      EXPECT_NEAR(r.makespan, (m + p - 1) * 3.0, 1e-9) << "p " << p << " m " << m;
      EXPECT_NEAR(r.bubble_fraction, static_cast<double>(p - 1) / (m + p - 1), 1e-9) << "p " << p << " m " << m;
      EXPECT_EQ(r.passes.size(), static_cast<std::size_t>(2 * p * m));
      // Stage s holds at most p - s micro-batches (1F1B's memory bound).
      for (int s = 0; s < p; ++s) EXPECT_EQ(r.peak_in_flight[static_cast<std::size_t>(s)], std::min(p - s, m));
    }
}

TEST(PipelineSchedule, InterleavedBubbleShrinksByTheChunks) {
  const int p = 4, m = 8, v = 2;
  // One chunk holds half the layers: half the time per pass.
  const ScheduleResult r = simulate_schedule(ScheduleKind::Interleaved, p, m, v, times(0.5, 1.0));
  EXPECT_NEAR(r.bubble_fraction, static_cast<double>(p - 1) / (v * m + p - 1), 1e-9);
  const ScheduleResult plain = simulate_schedule(ScheduleKind::OneF1B, p, m, 1, times(1.0, 2.0));
  EXPECT_LT(r.makespan, plain.makespan);
  EXPECT_THROW(simulate_schedule(ScheduleKind::Interleaved, 4, 6, 2, times(1, 2)), Error) << "m % p != 0";
}

TEST(PipelineSchedule, ZeroBubbleFillsTheCooldownWithWeightGradients) {
  const int p = 4, m = 8;
  const ScheduleResult plain = simulate_schedule(ScheduleKind::OneF1B, p, m, 1, times(1.0, 2.0, 0.5));
  const ScheduleResult zb = simulate_schedule(ScheduleKind::ZeroBubble, p, m, 1, times(1.0, 2.0, 0.5));
  EXPECT_EQ(zb.passes.size(), static_cast<std::size_t>(3 * p * m));
  EXPECT_LT(zb.makespan, plain.makespan);
  EXPECT_LT(zb.bubble_fraction, plain.bubble_fraction);
  // Equal F, B and W (B = 2 split in half): ZB-H1's step, m (F + B + W) + (p - 1)(F + B - W), from the
  // lists the training loop runs (zero_bubble_actions), for m >= p.
  for (int pp : {2, 3, 4})
    for (int mm : {4, 8, 12}) {
      const ScheduleResult r = simulate_schedule(ScheduleKind::ZeroBubble, pp, mm, 1, times(1.0, 2.0, 0.5));
      EXPECT_NEAR(r.makespan, 3.0 * mm + (pp - 1), 1e-9) << "p " << pp << " m " << mm;
    }
}

TEST(PipelineSchedule, DualPipeRunsBothDirectionsAndIdlesLess) {
  const int p = 4, m = 8;
  const ScheduleResult plain = simulate_schedule(ScheduleKind::OneF1B, p, m, 1, times(1.0, 2.0, 0.5));
  const ScheduleResult dual = simulate_schedule(ScheduleKind::DualPipe, p, m, 1, times(1.0, 2.0, 0.5));
  EXPECT_EQ(dual.passes.size(), static_cast<std::size_t>(3 * p * m));
  EXPECT_LT(dual.bubble_fraction, plain.bubble_fraction);
  EXPECT_THROW(simulate_schedule(ScheduleKind::DualPipe, 4, 7, 1, times(1, 2, 0.5)), Error) << "odd m";
}

// One source: the lists the training loop runs (dualpipe_actions) are the simulator's DualPipe order
// with the nominal times, device by device; with those times (F = B = W) DualPipe's step is shorter
// than 1F1B's.
TEST(PipelineSchedule, DualPipeTrainingListsAreTheSimulatorsOrder) {
  for (int p : {2, 4, 8})
    for (int m : {2 * p, 4 * p}) {
      const ScheduleResult r = simulate_schedule(ScheduleKind::DualPipe, p, m, 1, dualpipe_nominal_times());
      std::vector<std::vector<PipelineAction>> order(static_cast<std::size_t>(p));
      for (const Pass& x : r.passes)
        order[static_cast<std::size_t>(x.device)].push_back({x.kind == PassKind::F   ? ActionKind::Forward
                                                             : x.kind == PassKind::B ? ActionKind::Backward
                                                                                     : ActionKind::BackwardWeight,
                                                             x.micro_batch, x.direction});
      for (int d = 0; d < p; ++d)
        EXPECT_EQ(order[static_cast<std::size_t>(d)], dualpipe_actions(d, p, m)) << "p " << p << " m " << m;
      const ScheduleResult plain = simulate_schedule(ScheduleKind::OneF1B, p, m, 1, dualpipe_nominal_times());
      EXPECT_LT(r.makespan, plain.makespan) << "p " << p << " m " << m;
    }
}

TEST(PipelineSchedule, EveryPassStartsAfterItsInputs) {
  for (auto kind : {ScheduleKind::OneF1B, ScheduleKind::ZeroBubble, ScheduleKind::DualPipe}) {
    const int p = 4, m = 8;
    const double p2p = 0.1;
    const ScheduleResult r = simulate_schedule(kind, p, m, 1, times(1.0, 2.0, 0.5, p2p));
    using Key = std::tuple<int, int, int, int>;  // kind, direction, micro-batch, device
    std::map<Key, Pass> by;
    for (const Pass& x : r.passes) by[Key{static_cast<int>(x.kind), x.direction, x.micro_batch, x.device}] = x;
    for (const Pass& x : r.passes) {
      const int step = x.direction == 0 ? 1 : -1;  // the direction's next device
      const Key prev_f{0, x.direction, x.micro_batch, x.device - step};
      const Key next_b{1, x.direction, x.micro_batch, x.device + step};
      if (x.kind == PassKind::F && by.count(prev_f)) {
        EXPECT_GE(x.start + 1e-12, by[prev_f].end + p2p);
      }
      if (x.kind == PassKind::B && by.count(next_b)) {
        EXPECT_GE(x.start + 1e-12, by[next_b].end + p2p);
      }
    }
    // No device runs two passes at once.
    std::map<int, std::vector<std::pair<double, double>>> busy;
    for (const Pass& x : r.passes) busy[x.device].push_back({x.start, x.end});
    for (auto& [dev, spans] : busy) {
      std::sort(spans.begin(), spans.end());
      for (std::size_t i = 1; i < spans.size(); ++i) EXPECT_GE(spans[i].first + 1e-12, spans[i - 1].second);
    }
  }
}

// Per-stage times (an uneven split of the layers): equal entries are the uniform call, pass for
// pass, under every schedule; a stage three times as slow paces the pipeline: on 2 stages with m
// micro-batches the slow last stage runs its m F + B back to back after the first forward, then
// the first stage's last backward follows.
TEST(PipelineSchedule, PerStageTimesReduceToTheUniformOnesAndASlowStagePacesThePipeline) {
  const StageTimes t = times(1.0, 2.0, 0.5, 0.1);
  for (auto kind :
       {ScheduleKind::OneF1B, ScheduleKind::Interleaved, ScheduleKind::ZeroBubble, ScheduleKind::DualPipe}) {
    const int p = 4, m = 8, v = kind == ScheduleKind::Interleaved ? 2 : 1;
    const ScheduleResult uniform = simulate_schedule(kind, p, m, v, t);
    const ScheduleResult each = simulate_schedule(kind, p, m, v, std::vector<StageTimes>(p, t));
    EXPECT_EQ(each.makespan, uniform.makespan) << to_string(kind);
    EXPECT_EQ(each.peak_in_flight, uniform.peak_in_flight) << to_string(kind);
    ASSERT_EQ(each.passes.size(), uniform.passes.size());
    for (std::size_t i = 0; i < each.passes.size(); ++i) {
      EXPECT_EQ(each.passes[i].device, uniform.passes[i].device);
      EXPECT_EQ(each.passes[i].start, uniform.passes[i].start);
    }
  }
  const int m = 4;
  const ScheduleResult uneven = simulate_schedule(ScheduleKind::OneF1B, 2, m, 1, {times(1.0, 2.0), times(3.0, 6.0)});
  EXPECT_NEAR(uneven.makespan, 1.0 + m * 9.0 + 2.0, 1e-9);
  // The same work split evenly (2 + 4 per stage) takes (m + p - 1) x 6.
  const ScheduleResult even = simulate_schedule(ScheduleKind::OneF1B, 2, m, 1, times(2.0, 4.0));
  EXPECT_NEAR(even.makespan, (m + 1) * 6.0, 1e-9);
  EXPECT_GT(uneven.makespan, even.makespan);
  EXPECT_THROW(simulate_schedule(ScheduleKind::OneF1B, 2, m, 1, std::vector<StageTimes>{t}), Error);
}

}  // namespace schedule_test
}  // namespace kiln::sim
