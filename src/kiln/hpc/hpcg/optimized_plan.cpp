#include "kiln/hpc/hpcg/optimized_plan.h"

#include "kiln/runtime/error.h"

namespace kiln::hpcg {

OptimizedPlan plan_optimized_level(const Geometry& g, const Geometry* coarse) {
  OptimizedPlan plan;
  plan.layout = make_layout(g, /*colored=*/true);
  plan.halo = plan_halo(g, plan.layout);
  const auto& L = plan.layout;
  if (coarse) {
    LevelLayout C = make_layout(*coarse, true);
    plan.injected_first = local_index(L, 0, 0, 0);
    plan.coarse_of_injected.resize(static_cast<std::size_t>(C.nrow));
    for (int k = 0; k < C.nz; ++k)
      for (int j = 0; j < C.ny; ++j)
        for (int i = 0; i < C.nx; ++i) {
          int fine = local_index(L, 2 * i, 2 * j, 2 * k);
          KILN_CHECK(fine == plan.injected_first + i + C.nx * (j + C.ny * k),
                     "hpcg: injected points are not one block");
          plan.coarse_of_injected[static_cast<std::size_t>(fine - plan.injected_first)] = local_index(C, i, j, k);
        }
  }
  int waves = (L.nx - 1) + 2 * (L.ny - 1) + 4 * (L.nz - 1) + 1;
  plan.wave_start.assign(static_cast<std::size_t>(waves) + 1, 0);
  for (int k = 0; k < L.nz; ++k)
    for (int j = 0; j < L.ny; ++j)
      for (int i = 0; i < L.nx; ++i) ++plan.wave_start[static_cast<std::size_t>(i + 2 * j + 4 * k) + 1];
  for (int w = 0; w < waves; ++w)
    plan.wave_start[static_cast<std::size_t>(w) + 1] += plan.wave_start[static_cast<std::size_t>(w)];
  plan.wave_rows.resize(static_cast<std::size_t>(L.nrow));
  std::vector<int> next(plan.wave_start.begin(), plan.wave_start.end() - 1);
  for (int k = 0; k < L.nz; ++k)
    for (int j = 0; j < L.ny; ++j)
      for (int i = 0; i < L.nx; ++i)
        plan.wave_rows[static_cast<std::size_t>(next[static_cast<std::size_t>(i + 2 * j + 4 * k)]++)] =
            local_index(L, i, j, k);
  return plan;
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
