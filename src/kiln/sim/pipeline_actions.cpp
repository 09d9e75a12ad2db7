#include "kiln/sim/pipeline_actions.h"

#include <algorithm>

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

}  // namespace kiln::sim
