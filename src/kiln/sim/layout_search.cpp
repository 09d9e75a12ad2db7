#include "kiln/sim/layout_search.h"

#include <algorithm>

namespace kiln::sim {

namespace {
std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}
}  // namespace

SearchResult search_layouts(const ModelSpec& model, const SystemSpec& sys, const CalibrationTable* cal,
                            const SearchOptions& o) {
  SearchResult out;
  const auto& c = model.config;
  using models::RecomputeGranularity;
  for (int tp : divisors(o.devices)) {
    if (tp > sys.gpus_per_node) continue;  // tensor parallelism stays on NVLink
    for (int pp : divisors(o.devices / tp))
      for (int cp : divisors(o.devices / (tp * pp))) {
        const int dp = o.devices / (tp * pp * cp);
        std::vector<int> vpps = {1};
        if (pp > 1)
          for (int v = 2; v <= 8; ++v)
            if (c.num_layers % (pp * v) == 0) vpps.push_back(v);
        std::vector<int> eps = {1};
        if (model.moe.enabled()) {
          eps.clear();
          for (int ep : divisors(dp * cp * tp))
            if (model.moe.num_experts % ep == 0) eps.push_back(ep);
        }
        for (int vpp : vpps)
          for (int ep : eps)
            for (std::int64_t mbs : {1, 2, 4, 8}) {
              if (o.global_batch_size % (mbs * dp) != 0) continue;
              for (auto rc : {RecomputeGranularity::None, RecomputeGranularity::Selective, RecomputeGranularity::Full})
                for (bool distopt : {true, false})
                  for (bool fp8 : {false, true}) {
                    if (fp8 && (!o.allow_fp8 || !o.bf16 || sys.peak_flops_fp8 <= 0)) continue;
                    if (!distopt && dp * cp == 1) continue;  // the same layout
                    Layout l;
                    l.tp = tp;
                    l.pp = pp;
                    l.cp = cp;
                    l.dp = dp;
                    l.ep = ep;
                    l.vpp = vpp;
                    l.sequence_parallel = tp > 1;
                    l.distributed_optimizer = distopt;
                    l.fp8 = fp8;
                    l.bf16 = o.bf16;
                    l.gradient_accumulation_fusion = o.gradient_accumulation_fusion;
                    l.micro_batch_size = mbs;
                    l.global_batch_size = o.global_batch_size;
                    l.recompute = rc;
                    l.schedule = vpp > 1 ? ScheduleKind::Interleaved : o.schedule;
                    Prediction p = predict(model, l, sys, cal, o.predict);
                    // Thousands of layouts: the passes of each schedule are not kept (predict the
                    // chosen one again to draw it).
                    p.schedule.passes = {};
                    (p.invalid.empty() ? out.ranked : out.rejected).push_back(std::move(p));
                  }
            }
      }
  }
  std::stable_sort(out.ranked.begin(), out.ranked.end(),
                   [](const Prediction& a, const Prediction& b) { return a.tokens_per_second > b.tokens_per_second; });
  return out;
}

}  // namespace kiln::sim
