#include "kiln/sim/pipeline_schedule.h"

#include <algorithm>
#include <limits>

#include "kiln/runtime/error.h"
#include "kiln/sim/pipeline_actions.h"

namespace kiln::sim {

std::string_view to_string(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::OneF1B: return "1f1b";
    case ScheduleKind::Interleaved: return "interleaved";
    case ScheduleKind::ZeroBubble: return "zero-bubble";
    case ScheduleKind::DualPipe: return "dualpipe";
  }
  return "?";
}

ScheduleKind parse_schedule(std::string_view s) {
  if (s == "1f1b") return ScheduleKind::OneF1B;
  if (s == "interleaved") return ScheduleKind::Interleaved;
  if (s == "zero-bubble") return ScheduleKind::ZeroBubble;
  if (s == "dualpipe") return ScheduleKind::DualPipe;
  KILN_FAIL("--pipeline-schedule: '{}' is not one of 1f1b, interleaved, zero-bubble, dualpipe", s);
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Virtual stage k of a direction is chunk k / p on device k % p (direction 0), or on device
// p-1 - k % p (direction 1).

struct Op {
  PassKind kind;
  int direction, micro_batch, vstage;
};

class Engine {
 public:
  Engine(int p, int m, int v, const StageTimes& t) : p_(p), m_(m), v_(v), t_(t), stage_count_(p * v) {
    free_at_.assign(static_cast<std::size_t>(p), 0.0);
    in_flight_.assign(static_cast<std::size_t>(p), 0);
    result_.peak_in_flight.assign(static_cast<std::size_t>(p), 0);
    end_.assign(static_cast<std::size_t>(3 * 2 * m * stage_count_), kInf);  // slot() spaces for two directions
  }

  // Where a pass's end time is kept: one slot per (kind, direction, micro-batch, virtual stage).
  std::size_t slot(PassKind k, int direction, int micro_batch, int vstage) const {
    return static_cast<std::size_t>(((static_cast<int>(k) * 2 + direction) * m_ + micro_batch) * stage_count_ + vstage);
  }

  int device_of(int direction, int vstage) const { return direction == 0 ? vstage % p_ : p_ - 1 - vstage % p_; }
  int chunk_of(int vstage) const { return vstage / p_; }

  // When this op's inputs are on its device; kInf while a producer has not run.
  double ready_time(const Op& op) const {
    const int last = stage_count_ - 1;
    auto done = [&](PassKind k, int vs) -> double { return end_[slot(k, op.direction, op.micro_batch, vs)]; };
    const int dev = device_of(op.direction, op.vstage);
    auto arrive = [&](double t, int from_vs) {
      return t == kInf ? kInf : t + (device_of(op.direction, from_vs) == dev ? 0.0 : t_.p2p);
    };
    switch (op.kind) {
      case PassKind::F: return op.vstage == 0 ? 0.0 : arrive(done(PassKind::F, op.vstage - 1), op.vstage - 1);
      case PassKind::B: {
        const double own = done(PassKind::F, op.vstage);
        if (op.vstage == last) return own;
        return std::max(own, arrive(done(PassKind::B, op.vstage + 1), op.vstage + 1));
      }
      case PassKind::W: return done(PassKind::B, op.vstage);
    }
    return kInf;
  }

  double duration(PassKind k) const {
    const double w = t_.backward * t_.weight_fraction;
    if (k == PassKind::F) return t_.forward;
    if (k == PassKind::W) return w;
    return split_ ? t_.backward - w : t_.backward;
  }

  void run(const Op& op, double start) {
    const int dev = device_of(op.direction, op.vstage);
    const double end = start + duration(op.kind);
    end_[slot(op.kind, op.direction, op.micro_batch, op.vstage)] = end;
    free_at_[static_cast<std::size_t>(dev)] = end;
    auto& held = in_flight_[static_cast<std::size_t>(dev)];
    if (op.kind == PassKind::F) held += 1;
    // Activations go with the weight gradient when it is split off (it still needs the inputs).
    if ((op.kind == PassKind::B && !split_) || op.kind == PassKind::W) held -= 1;
    auto& peak = result_.peak_in_flight[static_cast<std::size_t>(dev)];
    peak = std::max(peak, held);
    result_.passes.push_back(Pass{op.kind, dev, op.micro_batch, chunk_of(op.vstage), op.direction, start, end});
  }

  bool split_ = false;
  int p_, m_, v_;
  StageTimes t_;
  int stage_count_;
  std::vector<double> end_;  // kInf: not run yet
  std::vector<double> free_at_;
  std::vector<int> in_flight_;
  ScheduleResult result_;
};

// A rank's list of actions (pipeline_actions.h, the lists the training loop runs) as the engine's
// passes: chunk c of device s is virtual stage c * p + s; under DualPipe the chunk is the direction,
// device s being stage s of direction 0 and stage p - 1 - s of direction 1.
std::vector<Op> order_of(const std::vector<PipelineAction>& actions, int s, int p, bool dualpipe) {
  std::vector<Op> order;
  for (const PipelineAction& a : actions) {
    const PassKind kind = a.kind == ActionKind::Forward    ? PassKind::F
                          : a.kind == ActionKind::Backward ? PassKind::B
                                                           : PassKind::W;
    if (dualpipe)
      order.push_back({kind, a.chunk, a.micro_batch, a.chunk == 0 ? s : p - 1 - s});
    else
      order.push_back({kind, 0, a.micro_batch, a.chunk * p + s});
  }
  return order;
}

// Fixed per-device orders (1F1B, interleaved, ZB-H1's or DualPipe's with their W passes, `split`):
// the device that can start its next pass earliest runs it.
ScheduleResult run_fixed(int p, int m, int v, const StageTimes& times, ScheduleKind kind) {
  Engine e(p, m, v, times);
  e.split_ = kind == ScheduleKind::ZeroBubble || kind == ScheduleKind::DualPipe;
  std::vector<std::vector<Op>> orders;
  const std::vector<std::vector<PipelineAction>> lists =
      kind == ScheduleKind::ZeroBubble ? zero_bubble_schedule_actions(p, m)
      : kind == ScheduleKind::DualPipe ? dualpipe_schedule_actions(p, m)
                                       : pipeline_schedule_actions(p, m, v);
  for (int s = 0; s < p; ++s)
    orders.push_back(order_of(lists[static_cast<std::size_t>(s)], s, p, kind == ScheduleKind::DualPipe));
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  for (;;) {
    int best = -1;
    double best_start = kInf;
    for (int s = 0; s < p; ++s) {
      const auto d = static_cast<std::size_t>(s);
      if (next[d] >= orders[d].size()) continue;
      const double ready = e.ready_time(orders[d][next[d]]);
      if (ready == kInf) continue;
      const double start = std::max(e.free_at_[d], ready);
      if (start < best_start) {
        best_start = start;
        best = s;
      }
    }
    if (best < 0) break;
    const auto d = static_cast<std::size_t>(best);
    e.run(orders[d][next[d]++], best_start);
  }
  for (std::size_t d = 0; d < orders.size(); ++d)
    KILN_CHECK(next[d] == orders[d].size(),
               "pipeline schedule: device {} deadlocked after {} of {} passes (a bug in the order)", d, next[d],
               orders[d].size());
  return std::move(e.result_);
}

void finish(ScheduleResult& r, int p) {
  double busy = 0;
  for (const Pass& x : r.passes) {
    r.makespan = std::max(r.makespan, x.end);
    busy += x.end - x.start;
  }
  r.bubble_fraction = r.makespan > 0 ? 1.0 - busy / (r.makespan * p) : 0.0;
}

}  // namespace

ScheduleResult simulate_schedule(ScheduleKind kind, int p, int m, int v, const StageTimes& times) {
  KILN_CHECK(p >= 1 && m >= 1 && v >= 1, "pipeline schedule: p, m and v must be at least 1 (got {}, {}, {})", p, m, v);
  ScheduleResult r;
  switch (kind) {
    case ScheduleKind::OneF1B: r = run_fixed(p, m, 1, times, kind); break;
    case ScheduleKind::Interleaved:
      KILN_CHECK(v == 1 || m % p == 0,
                 "--num-layers-per-virtual-pipeline-stage: the interleaved schedule needs the micro-batches per step "
                 "({}) to be a multiple of --pipeline-model-parallel-size ({})",
                 m, p);
      r = run_fixed(p, m, v, times, kind);
      break;
    case ScheduleKind::ZeroBubble: r = run_fixed(p, m, 1, times, kind); break;
    case ScheduleKind::DualPipe:
      // The lists `kiln pretrain-gpt --pipeline-schedule dualpipe` runs (their sizes checked there).
      r = run_fixed(p, m, 1, times, kind);
      break;
  }
  finish(r, p);
  return r;
}

}  // namespace kiln::sim
