// The pipeline schedules as action lists (sim/pipeline_actions.h), the lists the training loop runs:
// their counts, forward before backward, Megatron's warm-up, that every activation or gradient one
// rank sends has a receive on its peer, and that the ranks run them to the end when each waits for
// its inputs (no deadlock).
#include "kiln/sim/pipeline_actions.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "kiln/runtime/error.h"
#include "kiln/sim/pipeline_schedule.h"

namespace kiln::sim {
namespace pipeline_actions_test {

using A = PipelineAction;
constexpr ActionKind F = ActionKind::Forward, B = ActionKind::Backward, W = ActionKind::BackwardWeight;

TEST(PipelineActions, OneF1BOfTwoStagesIsMegatronsOrder) {
  EXPECT_EQ(pipeline_actions(0, 2, 4, 1),
            (std::vector<A>{{F, 0, 0}, {F, 1, 0}, {B, 0, 0}, {F, 2, 0}, {B, 1, 0}, {F, 3, 0}, {B, 2, 0}, {B, 3, 0}}));
  EXPECT_EQ(pipeline_actions(1, 2, 4, 1),
            (std::vector<A>{{F, 0, 0}, {B, 0, 0}, {F, 1, 0}, {B, 1, 0}, {F, 2, 0}, {B, 2, 0}, {F, 3, 0}, {B, 3, 0}}));
  // Fewer micro-batches than the warm-up: all forwards, then all backwards.
  EXPECT_EQ(pipeline_actions(0, 4, 2, 1), (std::vector<A>{{F, 0, 0}, {F, 1, 0}, {B, 0, 0}, {B, 1, 0}}));
}

TEST(PipelineActions, InterleavedGoesChunkByChunkInGroupsOfP) {
  // p = 2, m = 4, v = 2, rank 1: warm-up (2 - 1 - 1) * 2 + (2 - 1) * 2 = 2 forwards: micro-batches 0, 1 of
  // chunk 0; then forwards of chunk 1 alternate with backwards of chunk 1 (the last virtual stage).
  const std::vector<A> r1 = pipeline_actions(1, 2, 4, 2);
  ASSERT_EQ(r1.size(), 16u);
  EXPECT_EQ(r1[0], (A{F, 0, 0}));
  EXPECT_EQ(r1[1], (A{F, 1, 0}));
  EXPECT_EQ(r1[2], (A{F, 0, 1}));
  EXPECT_EQ(r1[3], (A{B, 0, 1}));
  EXPECT_EQ(r1[4], (A{F, 1, 1}));
  EXPECT_EQ(r1[5], (A{B, 1, 1}));
  // m == p: every forward first (Megatron's rule).
  const std::vector<A> all_first = pipeline_actions(1, 2, 2, 2);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(all_first[static_cast<std::size_t>(i)].kind, F) << i;
  EXPECT_THROW(pipeline_actions(0, 4, 6, 2), Error) << "m % p != 0 with interleaving";
  EXPECT_THROW(pipeline_actions(2, 2, 4, 1), Error) << "rank beyond p";
}

// Each (micro-batch, chunk) forward once and backward once, the forward first; 2 m v actions.
TEST(PipelineActions, EveryMicroBatchRunsForwardThenBackwardOncePerChunk) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 4, 8, 16})
      for (int v : {1, 2, 3}) {
        if (v > 1 && m % p != 0) continue;
        for (int r = 0; r < p; ++r) {
          const std::vector<A> actions = pipeline_actions(r, p, m, v);
          ASSERT_EQ(actions.size(), static_cast<std::size_t>(2 * m * v)) << p << " " << m << " " << v;
          std::set<std::pair<int, int>> forwarded, backwarded;
          for (const A& a : actions) {
            ASSERT_GE(a.chunk, 0);
            ASSERT_LT(a.chunk, v);
            ASSERT_GE(a.micro_batch, 0);
            ASSERT_LT(a.micro_batch, m);
            const auto key = std::make_pair(a.micro_batch, a.chunk);
            if (a.kind == F) {
              EXPECT_TRUE(forwarded.insert(key).second) << "forward twice";
            } else {
              EXPECT_TRUE(forwarded.contains(key))
                  << "backward of micro-batch " << a.micro_batch << " chunk " << a.chunk << " before its forward (p "
                  << p << " m " << m << " v " << v << " rank " << r << ")";
              EXPECT_TRUE(backwarded.insert(key).second) << "backward twice";
            }
          }
          EXPECT_EQ(forwarded.size(), static_cast<std::size_t>(m * v));
          EXPECT_EQ(backwarded.size(), static_cast<std::size_t>(m * v));
          // 1F1B's memory bound: at most p - r micro-batches in flight on rank r.
          if (v == 1) {
            int held = 0, peak = 0;
            for (const A& a : actions) peak = std::max(peak, held += a.kind == F ? 1 : -1);
            EXPECT_EQ(peak, std::min(p - r, m));
          }
        }
      }
}

// The point-to-point traffic the lists imply, as the executor sends it: a forward of virtual stage
// s < last sends its output to stage s + 1, a backward of stage s > 0 sends its input gradient to
// stage s - 1 (a W sends nothing). Every message has exactly one receive on the peer, and running
// the lists with blocking receives and buffered sends reaches the end on every rank (no rank waits
// forever).
// DualPipe (`dualpipe`): the chunk is the direction, rank r being stage r of direction 0 and stage
// p - 1 - r of direction 1 (the micro-batch numbers of the directions differ, so they key apart).
void expect_pairing_and_progress(const std::vector<std::vector<A>>& lists, int p, int v, const std::string& what,
                                 bool dualpipe = false) {
  const int last = dualpipe ? p - 1 : p * v - 1;
  auto stage = [&](int r, int c) { return dualpipe ? (c == 0 ? r : p - 1 - r) : c * p + r; };
  // (kind, micro-batch, destination virtual stage) -> messages sent / receives posted.
  std::map<std::tuple<int, int, int>, int> sent, received;
  for (int r = 0; r < p; ++r)
    for (const A& a : lists[static_cast<std::size_t>(r)]) {
      const int s = stage(r, a.chunk);
      if (a.kind == F) {
        if (s < last) ++sent[{0, a.micro_batch, s + 1}];
        if (s > 0) ++received[{0, a.micro_batch, s}];
      } else if (a.kind == B) {
        if (s > 0) ++sent[{1, a.micro_batch, s - 1}];
        if (s < last) ++received[{1, a.micro_batch, s}];
      }
    }
  EXPECT_EQ(sent, received) << what;

  // Execution: a rank's next action runs once its input has been produced.
  std::set<std::tuple<int, int, int>> delivered;
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      auto& i = next[static_cast<std::size_t>(r)];
      const auto& list = lists[static_cast<std::size_t>(r)];
      while (i < list.size()) {
        const A& a = list[i];
        const int s = stage(r, a.chunk);
        const bool needs = a.kind == F ? s > 0 : a.kind == B && s < last;
        if (needs && !delivered.contains({a.kind == F ? 0 : 1, a.micro_batch, s})) break;
        if (a.kind == F && s < last) delivered.insert({0, a.micro_batch, s + 1});
        if (a.kind == B && s > 0) delivered.insert({1, a.micro_batch, s - 1});
        ++i;
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r)
    EXPECT_EQ(next[static_cast<std::size_t>(r)], lists[static_cast<std::size_t>(r)].size())
        << "rank " << r << " stuck (" << what << ")";
}

TEST(PipelineActions, SendsPairWithReceivesAndTheListsRunToTheEnd) {
  for (int p : {2, 3, 4})
    for (int m : {1, 2, 4, 8})
      for (int v : {1, 2}) {
        if (v > 1 && m % p != 0) continue;
        expect_pairing_and_progress(pipeline_schedule_actions(p, m, v), p, v,
                                    "p " + std::to_string(p) + " m " + std::to_string(m) + " v " + std::to_string(v));
      }
}

TEST(PipelineActions, ZeroBubbleOfTwoStagesDefersTheLastStagesWeightGradients) {
  // Rank 0 runs each W right after its B (its F waits on memory otherwise: p = 2 activations held);
  // rank 1, whose 1F1B would wait for rank 0's next forward, fills that wait with a W.
  EXPECT_EQ(zero_bubble_actions(0, 2, 4), (std::vector<A>{{F, 0, 0},
                                                          {F, 1, 0},
                                                          {B, 0, 0},
                                                          {W, 0, 0},
                                                          {F, 2, 0},
                                                          {B, 1, 0},
                                                          {W, 1, 0},
                                                          {F, 3, 0},
                                                          {B, 2, 0},
                                                          {W, 2, 0},
                                                          {B, 3, 0},
                                                          {W, 3, 0}}));
  EXPECT_EQ(zero_bubble_actions(1, 2, 4), (std::vector<A>{{F, 0, 0},
                                                          {B, 0, 0},
                                                          {F, 1, 0},
                                                          {B, 1, 0},
                                                          {W, 0, 0},
                                                          {F, 2, 0},
                                                          {B, 2, 0},
                                                          {W, 1, 0},
                                                          {F, 3, 0},
                                                          {B, 3, 0},
                                                          {W, 2, 0},
                                                          {W, 3, 0}}));
  EXPECT_THROW(zero_bubble_actions(2, 2, 4), Error) << "rank beyond p";
}

// Each micro-batch's F, B and W once, in that order; the F/B order is 1F1B's; at most p
// micro-batches hold activations (F done, W not) on any rank; the traffic pairs and runs through.
TEST(PipelineActions, ZeroBubbleRunsEveryPassOnceWAfterItsB) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      const auto lists = zero_bubble_schedule_actions(p, m);
      ASSERT_EQ(lists.size(), static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r) {
        const std::vector<A>& actions = lists[static_cast<std::size_t>(r)];
        ASSERT_EQ(actions.size(), static_cast<std::size_t>(3 * m)) << "p " << p << " m " << m << " rank " << r;
        std::vector<int> state(static_cast<std::size_t>(m), 0);  // 0: none, 1: F, 2: B, 3: W done
        std::vector<A> forward_backward;
        int held = 0, peak = 0;
        for (const A& a : actions) {
          ASSERT_EQ(a.chunk, 0);
          ASSERT_GE(a.micro_batch, 0);
          ASSERT_LT(a.micro_batch, m);
          int& st = state[static_cast<std::size_t>(a.micro_batch)];
          const int expected = a.kind == F ? 0 : a.kind == B ? 1 : 2;
          EXPECT_EQ(st, expected) << "micro-batch " << a.micro_batch << " out of order on rank " << r << " (p " << p
                                  << " m " << m << ")";
          st = expected + 1;
          if (a.kind != W) forward_backward.push_back(a);
          held += a.kind == F ? 1 : a.kind == W ? -1 : 0;
          peak = std::max(peak, held);
        }
        for (int s : state) EXPECT_EQ(s, 3);
        EXPECT_EQ(forward_backward, pipeline_actions(r, p, m, 1)) << "rank " << r << " p " << p << " m " << m;
        EXPECT_LE(peak, p);
      }
      expect_pairing_and_progress(lists, p, 1, "zero-bubble p " + std::to_string(p) + " m " + std::to_string(m));
    }
}

// DualPipe (the simulator's order with the nominal times, pipeline_schedule.h): each rank runs every
// micro-batch of direction 0 through chunk 0 and every one of direction 1 through chunk 1, each F, B
// and W once and in that order; at most p + 1 micro-batch-chunks hold activations on a rank; the
// traffic pairs and runs through; odd sizes are refused naming the flag.
TEST(PipelineActions, DualPipeRunsBothDirectionsEveryPassOnce) {
  for (int p : {2, 4, 6, 8})
    for (int m : {2, 4, 8, 16, 20}) {
      const std::string what = "dualpipe p " + std::to_string(p) + " m " + std::to_string(m);
      const auto lists = dualpipe_schedule_actions(p, m, dualpipe_nominal_times());
      ASSERT_EQ(lists.size(), static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r) {
        const std::vector<A>& actions = lists[static_cast<std::size_t>(r)];
        EXPECT_EQ(actions, dualpipe_actions(r, p, m));
        ASSERT_EQ(actions.size(), static_cast<std::size_t>(3 * m)) << what << " rank " << r;
        std::vector<int> state(static_cast<std::size_t>(m), 0);  // 0: none, 1: F, 2: B, 3: W done
        int held = 0, peak = 0;
        for (const A& a : actions) {
          ASSERT_GE(a.micro_batch, 0);
          ASSERT_LT(a.micro_batch, m);
          ASSERT_EQ(a.chunk, a.micro_batch < m / 2 ? 0 : 1) << "the direction's chunk";
          int& st = state[static_cast<std::size_t>(a.micro_batch)];
          const int expected = a.kind == F ? 0 : a.kind == B ? 1 : 2;
          EXPECT_EQ(st, expected) << "micro-batch " << a.micro_batch << " out of order on rank " << r << " (" << what
                                  << ")";
          st = expected + 1;
          held += a.kind == F ? 1 : a.kind == W ? -1 : 0;
          peak = std::max(peak, held);
        }
        for (int x : state) EXPECT_EQ(x, 3);
        EXPECT_LE(peak, p + 1) << what << " rank " << r;
      }
      expect_pairing_and_progress(lists, p, 1, what, /*dualpipe=*/true);
    }
  // Both ends start at once: rank 0's first forward is direction 0's, rank p - 1's direction 1's.
  EXPECT_EQ(dualpipe_actions(0, 4, 8).front(), (A{F, 0, 0}));
  EXPECT_EQ(dualpipe_actions(3, 4, 8).front(), (A{F, 4, 1}));
  EXPECT_THROW(dualpipe_actions(0, 4, 7), Error) << "odd m";
  EXPECT_THROW(dualpipe_actions(0, 3, 8), Error) << "odd p";
  try {
    check_dualpipe_sizes(4, 7);
    ADD_FAILURE() << "odd m accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--global-batch-size"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("is 7"), std::string::npos) << e.what();
  }
}

}  // namespace pipeline_actions_test
}  // namespace kiln::sim
