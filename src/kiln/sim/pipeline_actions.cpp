#include "kiln/sim/pipeline_actions.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <optional>

#include "kiln/runtime/error.h"

namespace kiln::sim {

std::vector<PipelineAction> pipeline_actions(int rank, int p, int m, int v) {
  KILN_CHECK(p >= 1 && m >= 1 && v >= 1 && rank >= 0 && rank < p,
             "pipeline schedule: needs 0 <= rank < p and p, m, v >= 1 (got rank {}, p {}, m {}, v {})", rank, p, m, v);
  KILN_CHECK(v == 1 || m % p == 0,
             "the interleaved pipeline schedule needs the micro-batches per step ({}: --global-batch-size / "
             "(--micro-batch-size x data-parallel size)) to be a multiple of --pipeline-model-parallel-size ({})",
             m, p);
  const int total = m * v;
  // The k-th forward of the rank runs micro-batch micro(k) through chunk chunk(k); the k-th backward
  // the same micro-batch through the chunks in reverse (Megatron's get_model_chunk_id).
  auto chunk = [&](int k, bool forward) {
    const int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto micro = [&](int k) { return v == 1 ? k : (k / (p * v)) * p + k % p; };
  int warmup = v == 1 ? p - rank - 1 : (m == p ? total : (p - rank - 1) * 2 + (v - 1) * p);
  warmup = std::min(warmup, total);
  std::vector<PipelineAction> out;
  out.reserve(static_cast<std::size_t>(2 * total));
  int f = 0, b = 0;
  auto push_f = [&] {
    out.push_back({ActionKind::Forward, micro(f), chunk(f, true)});
    ++f;
  };
  auto push_b = [&] {
    out.push_back({ActionKind::Backward, micro(b), chunk(b, false)});
    ++b;
  };
  for (int i = 0; i < warmup; ++i) push_f();
  while (f < total) {
    push_f();
    push_b();
  }
  while (b < total) push_b();
  return out;
}

std::vector<std::vector<PipelineAction>> pipeline_schedule_actions(int p, int m, int v) {
  std::vector<std::vector<PipelineAction>> out;
  for (int r = 0; r < p; ++r) out.push_back(pipeline_actions(r, p, m, v));
  return out;
}

std::vector<std::vector<PipelineAction>> zero_bubble_schedule_actions(int p, int m) {
  KILN_CHECK(p >= 1 && m >= 1, "pipeline schedule: zero-bubble needs p, m >= 1 (got p {}, m {})", p, m);
  const auto P = static_cast<std::size_t>(p);
  const auto M = static_cast<std::size_t>(m);
  std::vector<std::vector<PipelineAction>> base = pipeline_schedule_actions(p, m, 1);
  constexpr int kNever = std::numeric_limits<int>::max();
  // The step at whose end each rank's F / B of each micro-batch was done (kNever: not yet).
  std::vector<std::vector<int>> f_end(P, std::vector<int>(M, kNever)), b_end(P, std::vector<int>(M, kNever));
  std::vector<std::size_t> next(P, 0);
  std::vector<std::deque<int>> pending_w(P);  // micro-batches whose B ran and W not yet, oldest first
  std::vector<int> held(P, 0);                // micro-batches whose F ran and W not yet
  std::vector<std::vector<PipelineAction>> out(P);
  auto busy = [&] {
    for (std::size_t r = 0; r < P; ++r)
      if (next[r] < base[r].size() || !pending_w[r].empty()) return true;
    return false;
  };
  for (int step = 0; busy(); ++step) {
    // Every rank decides on the state at the start of the step (what arrived by then), then all run.
    std::vector<std::optional<PipelineAction>> chosen(P);
    for (std::size_t r = 0; r < P; ++r) {
      if (next[r] < base[r].size()) {
        const PipelineAction a = base[r][next[r]];
        const auto mb = static_cast<std::size_t>(a.micro_batch);
        const bool ready = a.kind == ActionKind::Forward ? (r == 0 || f_end[r - 1][mb] < step) && held[r] < p
                                                         : r + 1 == P || b_end[r + 1][mb] < step;
        if (ready) chosen[r] = a;
      }
      if (!chosen[r] && !pending_w[r].empty())
        chosen[r] = PipelineAction{ActionKind::BackwardWeight, pending_w[r].front(), 0};
    }
    for (std::size_t r = 0; r < P; ++r) {
      if (!chosen[r]) continue;
      const PipelineAction a = *chosen[r];
      const auto mb = static_cast<std::size_t>(a.micro_batch);
      out[r].push_back(a);
      switch (a.kind) {
        case ActionKind::Forward:
          f_end[r][mb] = step;
          ++held[r];
          ++next[r];
          break;
        case ActionKind::Backward:
          b_end[r][mb] = step;
          pending_w[r].push_back(a.micro_batch);
          ++next[r];
          break;
        case ActionKind::BackwardWeight:
          pending_w[r].pop_front();
          --held[r];
          break;
      }
    }
  }
  return out;
}

void check_dualpipe_sizes(int p, int m) {
  KILN_CHECK(p >= 1 && m >= 1, "pipeline schedule: dualpipe needs p, m >= 1 (got p {}, m {})", p, m);
  KILN_CHECK(p % 2 == 0 || p == 1,
             "--pipeline-schedule dualpipe needs an even --pipeline-model-parallel-size (each rank holds stage s of "
             "one direction and stage p - 1 - s of the other), got {}",
             p);
  KILN_CHECK(m % 2 == 0,
             "--pipeline-schedule dualpipe needs an even number of micro-batches per step (half enter at each end of "
             "the pipeline): --global-batch-size / (--micro-batch-size x data-parallel size) is {}",
             m);
}

std::vector<std::vector<PipelineAction>> dualpipe_schedule_actions(int p, int m) {
  check_dualpipe_sizes(p, m);
  const auto P = static_cast<std::size_t>(p);
  const int half = m / 2;
  constexpr int kNever = std::numeric_limits<int>::max();
  // Stage s of direction d is on rank d == 0 ? s : p - 1 - s (and the other way round).
  auto stage_of = [p](int direction, int rank) { return direction == 0 ? rank : p - 1 - rank; };
  // The step at whose end stage s of direction d ran its F / B of the direction's micro-batch i.
  auto at = [&](int d, int s, int i) {
    return (static_cast<std::size_t>(d) * P + static_cast<std::size_t>(s)) * static_cast<std::size_t>(half) +
           static_cast<std::size_t>(i);
  };
  std::vector<int> f_end(2 * P * static_cast<std::size_t>(half), kNever), b_end(f_end);
  struct Item {
    int direction, index;  // index: the micro-batch within its direction
  };
  struct Rank {
    int next_f[2] = {0, 0};
    int held[2] = {0, 0};       // forwards done, W not yet, per direction
    std::vector<Item> ready_b;  // forwards done here, backward not yet, oldest first
    std::deque<Item> pending_w;
  };
  std::vector<Rank> ranks(P);
  std::vector<std::vector<PipelineAction>> out(P);
  auto global = [half](const Item& x) { return x.direction * half + x.index; };
  auto busy = [&] {
    for (const Rank& r : ranks)
      if (r.next_f[0] < half || r.next_f[1] < half || !r.ready_b.empty() || !r.pending_w.empty()) return true;
    return false;
  };
  for (int step = 0; busy(); ++step) {
    // Every rank decides on the state at the start of the step (what arrived by then), then all run.
    std::vector<std::optional<PipelineAction>> chosen(P);
    std::vector<std::size_t> chosen_b(P, 0);
    for (std::size_t r = 0; r < P; ++r) {
      Rank& st = ranks[r];
      const int rank = static_cast<int>(r);
      for (std::size_t i = 0; i < st.ready_b.size() && !chosen[r]; ++i) {
        const Item x = st.ready_b[i];
        const int s = stage_of(x.direction, rank);
        if (s == p - 1 || b_end[at(x.direction, s + 1, x.index)] < step) {
          chosen[r] = PipelineAction{ActionKind::Backward, global(x), x.direction};
          chosen_b[r] = i;
        }
      }
      for (int d = 0; d < 2 && !chosen[r]; ++d) {
        const int s = stage_of(d, rank), i = st.next_f[d];
        if (i >= half || st.held[d] >= p - s) continue;
        if (s == 0 || f_end[at(d, s - 1, i)] < step) chosen[r] = PipelineAction{ActionKind::Forward, global({d, i}), d};
      }
      if (!chosen[r] && !st.pending_w.empty())
        chosen[r] =
            PipelineAction{ActionKind::BackwardWeight, global(st.pending_w.front()), st.pending_w.front().direction};
    }
    bool ran = false;
    for (std::size_t r = 0; r < P; ++r) {
      if (!chosen[r]) continue;
      ran = true;
      Rank& st = ranks[r];
      const PipelineAction a = *chosen[r];
      const int d = a.chunk, i = a.micro_batch - d * half, s = stage_of(d, static_cast<int>(r));
      out[r].push_back(a);
      switch (a.kind) {
        case ActionKind::Forward:
          f_end[at(d, s, i)] = step;
          ++st.held[d];
          ++st.next_f[d];
          st.ready_b.push_back({d, i});
          break;
        case ActionKind::Backward:
          b_end[at(d, s, i)] = step;
          st.ready_b.erase(st.ready_b.begin() + static_cast<std::ptrdiff_t>(chosen_b[r]));
          st.pending_w.push_back({d, i});
          break;
        case ActionKind::BackwardWeight:
          st.pending_w.pop_front();
          --st.held[d];
          break;
      }
    }
    KILN_CHECK(ran, "pipeline schedule: the DualPipe lists deadlocked at step {} (a bug)", step);
  }
  return out;
}

std::vector<PipelineAction> dualpipe_actions(int rank, int p, int m) {
  KILN_CHECK(rank >= 0 && rank < p, "pipeline schedule: needs 0 <= rank < p (got rank {}, p {})", rank, p);
  return dualpipe_schedule_actions(p, m)[static_cast<std::size_t>(rank)];
}

std::vector<PipelineAction> zero_bubble_actions(int rank, int p, int m) {
  KILN_CHECK(rank >= 0 && rank < p, "pipeline schedule: needs 0 <= rank < p (got rank {}, p {})", rank, p);
  return zero_bubble_schedule_actions(p, m)[static_cast<std::size_t>(rank)];
}

}  // namespace kiln::sim
