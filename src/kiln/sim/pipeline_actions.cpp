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

std::vector<PipelineAction> zero_bubble_actions(int rank, int p, int m) {
  KILN_CHECK(rank >= 0 && rank < p, "pipeline schedule: needs 0 <= rank < p (got rank {}, p {})", rank, p);
  return zero_bubble_schedule_actions(p, m)[static_cast<std::size_t>(rank)];
}

}  // namespace kiln::sim
