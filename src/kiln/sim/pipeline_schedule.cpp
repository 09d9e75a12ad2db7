#include "kiln/sim/pipeline_schedule.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

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
  Engine(int p, int m, int v, std::vector<StageTimes> t) : p_(p), m_(m), v_(v), t_(std::move(t)), stage_count_(p * v) {
    KILN_CHECK(static_cast<int>(t_.size()) == p, "pipeline schedule: {} stages' times for {} stages", t_.size(), p);
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
    // The producer's stage sends (its activations, or their gradient: the same size).
    auto arrive = [&](double t, int from_vs) {
      return t == kInf ? kInf : t + (device_of(op.direction, from_vs) == dev ? 0.0 : times(from_vs).p2p);
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

  // Virtual stage k runs the layers of pipeline stage k % p, whichever device holds it (DualPipe's
  // direction 1 runs stage s on device p - 1 - s).
  const StageTimes& times(int vstage) const { return t_[static_cast<std::size_t>(vstage % p_)]; }

  double duration(const Op& op) const {
    const StageTimes& t = times(op.vstage);
    const double w = t.backward * t.weight_fraction;
    if (op.kind == PassKind::F) return t.forward;
    if (op.kind == PassKind::W) return w;
    return split_ ? t.backward - w : t.backward;
  }

  void run(const Op& op, double start) {
    const int dev = device_of(op.direction, op.vstage);
    const double end = start + duration(op);
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
  std::vector<StageTimes> t_;  // per pipeline stage
  int stage_count_;
  std::vector<double> end_;  // kInf: not run yet
  std::vector<double> free_at_;
  std::vector<int> in_flight_;
  ScheduleResult result_;
};

// A rank's list of actions (pipeline_actions.h, the lists the training loop runs) as the engine's
// passes: chunk c of device s is virtual stage c * p + s.
std::vector<Op> order_of(const std::vector<PipelineAction>& actions, int s, int p) {
  std::vector<Op> order;
  for (const PipelineAction& a : actions) {
    const PassKind kind = a.kind == ActionKind::Forward    ? PassKind::F
                          : a.kind == ActionKind::Backward ? PassKind::B
                                                           : PassKind::W;
    order.push_back({kind, 0, a.micro_batch, a.chunk * p + s});
  }
  return order;
}

// Fixed per-device orders (1F1B, interleaved, or ZB-H1's with its W passes, `split`): the device
// that can start its next pass earliest runs it.
ScheduleResult run_fixed(int p, int m, int v, const std::vector<StageTimes>& times, bool split) {
  Engine e(p, m, v, times);
  e.split_ = split;
  std::vector<std::vector<Op>> orders;
  for (int s = 0; s < p; ++s)
    orders.push_back(order_of(split ? zero_bubble_actions(s, p, m) : pipeline_actions(s, p, m, v), s, p));
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

// DualPipe: per device, the ready pass chosen greedily: B first (the oldest micro-batch), then F
// while fewer than the warm-up limit of its direction are in flight, W in idle time.
ScheduleResult run_dualpipe(int p, int m, const std::vector<StageTimes>& times) {
  Engine e(p, m, 1, times);
  e.split_ = true;
  const int per_direction = m / 2;
  struct DeviceState {
    // The next micro-batch to forward, per direction (global numbers: direction 1 has m/2 .. m - 1).
    std::vector<int> next_f{0, 0};
    std::vector<int> in_flight{0, 0};
    std::vector<Op> backlog_b;  // backward passes whose forward ran here
    std::vector<Op> pending_w;
  };
  std::vector<DeviceState> dev(static_cast<std::size_t>(p));
  for (DeviceState& st : dev) st.next_f[1] = per_direction;
  auto stage_in = [&](int direction, int device) { return direction == 0 ? device : p - 1 - device; };
  int remaining = 3 * 2 * per_direction * p;
  while (remaining > 0) {
    int best = -1, best_kind = -1, best_index = -1;
    double best_start = kInf;
    for (int d = 0; d < p; ++d) {
      auto& st = dev[static_cast<std::size_t>(d)];
      const double free = e.free_at_[static_cast<std::size_t>(d)];
      // Candidates: each direction's next forward, every listed backward.
      double start = kInf;
      int kind = -1, index = -1;
      for (std::size_t i = 0; i < st.backlog_b.size(); ++i) {
        const double r = e.ready_time(st.backlog_b[i]);
        if (r != kInf && std::max(free, r) < start) {
          start = std::max(free, r);
          kind = 1;
          index = static_cast<int>(i);
        }
      }
      for (int dir = 0; dir < 2; ++dir) {
        const int s = stage_in(dir, d);
        const int limit = p - s;  // 1F1B's warm-up per direction: p + 1 chunks held per device
        if (st.next_f[static_cast<std::size_t>(dir)] >= (dir + 1) * per_direction ||
            st.in_flight[static_cast<std::size_t>(dir)] >= limit)
          continue;
        const Op f{PassKind::F, dir, st.next_f[static_cast<std::size_t>(dir)], s};
        const double r = e.ready_time(f);
        // A backward ready at the same moment goes first.
        if (r != kInf && std::max(free, r) < start) {
          start = std::max(free, r);
          kind = 0;
          index = dir;
        }
      }
      if (!st.pending_w.empty() && (start > free || kind < 0)) {
        start = free;
        kind = 2;
        index = 0;
      }
      if (start < best_start) {
        best_start = start;
        best = d;
        best_kind = kind;
        best_index = index;
      }
    }
    KILN_CHECK(best >= 0, "pipeline schedule: DualPipe deadlocked with {} passes left (a bug)", remaining);
    auto& st = dev[static_cast<std::size_t>(best)];
    if (best_kind == 0) {
      const int dir = best_index;
      const Op f{PassKind::F, dir, st.next_f[static_cast<std::size_t>(dir)]++, stage_in(dir, best)};
      e.run(f, best_start);
      st.in_flight[static_cast<std::size_t>(dir)] += 1;
      st.backlog_b.push_back({PassKind::B, dir, f.micro_batch, f.vstage});
    } else if (best_kind == 1) {
      const Op b = st.backlog_b[static_cast<std::size_t>(best_index)];
      st.backlog_b.erase(st.backlog_b.begin() + best_index);
      e.run(b, best_start);
      st.pending_w.push_back({PassKind::W, b.direction, b.micro_batch, b.vstage});
    } else {
      const Op w = st.pending_w.front();
      st.pending_w.erase(st.pending_w.begin());
      e.run(w, best_start);
      st.in_flight[static_cast<std::size_t>(w.direction)] -= 1;
    }
    --remaining;
  }
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
  KILN_CHECK(p >= 1, "pipeline schedule: p must be at least 1 (got {})", p);
  return simulate_schedule(kind, p, m, v, std::vector<StageTimes>(static_cast<std::size_t>(p), times));
}

ScheduleResult simulate_schedule(ScheduleKind kind, int p, int m, int v, const std::vector<StageTimes>& times) {
  KILN_CHECK(p >= 1 && m >= 1 && v >= 1, "pipeline schedule: p, m and v must be at least 1 (got {}, {}, {})", p, m, v);
  KILN_CHECK(static_cast<int>(times.size()) == p, "pipeline schedule: {} stages' times for {} stages", times.size(), p);
  ScheduleResult r;
  switch (kind) {
    case ScheduleKind::OneF1B: r = run_fixed(p, m, 1, times, false); break;
    case ScheduleKind::Interleaved:
      KILN_CHECK(v == 1 || m % p == 0,
                 "--num-layers-per-virtual-pipeline-stage: the interleaved schedule needs the micro-batches per step "
                 "({}) to be a multiple of --pipeline-model-parallel-size ({})",
                 m, p);
      r = run_fixed(p, m, v, times, false);
      break;
    case ScheduleKind::ZeroBubble: r = run_fixed(p, m, 1, times, true); break;
    case ScheduleKind::DualPipe:
      check_dualpipe_sizes(p, m);
      r = run_dualpipe(p, m, times);
      break;
  }
  finish(r, p);
  return r;
}

std::vector<std::vector<PipelineAction>> dualpipe_schedule_actions(int p, int m, const StageTimes& times) {
  check_dualpipe_sizes(p, m);
  const ScheduleResult r = run_dualpipe(p, m, std::vector<StageTimes>(static_cast<std::size_t>(p), times));
  // A device runs its passes in the order they were scheduled (each starts once the last has ended).
  std::vector<std::vector<PipelineAction>> out(static_cast<std::size_t>(p));
  for (const Pass& x : r.passes) {
    const ActionKind kind = x.kind == PassKind::F   ? ActionKind::Forward
                            : x.kind == PassKind::B ? ActionKind::Backward
                                                    : ActionKind::BackwardWeight;
    out[static_cast<std::size_t>(x.device)].push_back({kind, x.micro_batch, x.direction});
  }
  return out;
}

StageTimes dualpipe_nominal_times() { return {.forward = 1.0, .backward = 2.0, .weight_fraction = 0.5, .p2p = 0.0}; }

std::vector<PipelineAction> dualpipe_actions(int rank, int p, int m) {
  KILN_CHECK(rank >= 0 && rank < p, "pipeline schedule: needs 0 <= rank < p (got rank {}, p {})", rank, p);
  return dualpipe_schedule_actions(p, m, dualpipe_nominal_times())[static_cast<std::size_t>(rank)];
}

}  // namespace kiln::sim
