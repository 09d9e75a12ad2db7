#include "kiln/hpc/hpcg/optimized_plan.h"

#include "kiln/runtime/error.h"

namespace kiln::hpcg {

OptimizedPlan plan_optimized_level(const Geometry& g, const Geometry* coarse) {
  OptimizedPlan plan;
  plan.layout = make_layout(g, /*colored=*/true);
  plan.halo = plan_halo(g, plan.layout);
  if (coarse) {
    const auto& L = plan.layout;
    plan.coarse = make_layout(*coarse, true);
    const auto& C = plan.coarse;
    plan.injected_first = local_index(L, 0, 0, 0);
    plan.injected_count = C.nrow;
    // The block property (first and last injected points where the formula puts them).
    KILN_CHECK(plan.injected_first == L.color_start[7] && plan.injected_first + C.nrow == L.color_start[8] &&
                   local_index(L, 2 * (C.nx - 1), 2 * (C.ny - 1), 2 * (C.nz - 1)) == L.color_start[8] - 1,
               "hpcg: the injected points are not the last colour's block");
  }
  return plan;
}

WaveSchedule plan_waves(const LevelLayout& L) {
  WaveSchedule w;
  int waves = (L.nx - 1) + 2 * (L.ny - 1) + 4 * (L.nz - 1) + 1;
  w.start.assign(static_cast<std::size_t>(waves) + 1, 0);
  for (int k = 0; k < L.nz; ++k)
    for (int j = 0; j < L.ny; ++j)
      for (int i = 0; i < L.nx; ++i) ++w.start[static_cast<std::size_t>(i + 2 * j + 4 * k) + 1];
  for (int v = 0; v < waves; ++v) w.start[static_cast<std::size_t>(v) + 1] += w.start[static_cast<std::size_t>(v)];
  w.rows.resize(static_cast<std::size_t>(L.nrow));
  std::vector<int> next(w.start.begin(), w.start.end() - 1);
  for (int k = 0; k < L.nz; ++k)
    for (int j = 0; j < L.ny; ++j)
      for (int i = 0; i < L.nx; ++i)
        w.rows[static_cast<std::size_t>(next[static_cast<std::size_t>(i + 2 * j + 4 * k)]++)] = local_index(L, i, j, k);
  return w;
}

std::int64_t count_local_nonzeros(const LevelLayout& L) {
  // A point has (number of in-domain neighbours along x) * (along y) * (along z) nonzeros, the
  // global domain's faces limiting each factor; sum the factors axis by axis.
  auto axis_sum = [](int n, std::int64_t g0, std::int64_t gn) {
    std::int64_t s = 0;
    for (int i = 0; i < n; ++i) s += 1 + (g0 + i > 0 ? 1 : 0) + (g0 + i < gn - 1 ? 1 : 0);
    return s;
  };
  return axis_sum(L.nx, L.gx0, L.gnx) * axis_sum(L.ny, L.gy0, L.gny) * axis_sum(L.nz, L.gz0, L.gnz);
}

}  // namespace kiln::hpcg
