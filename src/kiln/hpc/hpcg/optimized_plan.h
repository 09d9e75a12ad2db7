#pragma once
// OptimizedPlan: the host-side description of one level for the optimised engines (CPU and CUDA):
// the coloured layout, the halo and the injection onto the coarser level. Everything else is
// computed from it where it is used, in closed form (the matrix: generate_row; the injection map:
// coarse_of_injected), so setup costs next to nothing even for a 640^3 box.
#include <vector>

#include "kiln/hpc/hpcg/geometry.h"
#include "kiln/hpc/hpcg/halo_plan.h"
#include "kiln/hpc/hpcg/layout.h"

namespace kiln::hpcg {

struct OptimizedPlan {
  LevelLayout layout;  // coloured
  HaloPlan halo;
  // Injection: the points restriction samples are the all-even ones, which form the last colour:
  // one contiguous block of rows, injected_first .. injected_first + injected_count - 1, in the
  // coarse grid's lexicographic order. Kernels walk these fine rows in order (coalesced) and
  // scatter to coarse_of_injected(coarse, q) (layout.h). injected_count is 0 on the coarsest level.
  LevelLayout coarse;
  int injected_first = 0;
  int injected_count = 0;
};

OptimizedPlan plan_optimized_level(const Geometry& geometry, const Geometry* coarse);

// The natural-order sweep as wavefronts: point (i, j, k) depends only on earlier points whose
// i + 2j + 4k is smaller (every lexicographically earlier 27-point neighbour has one), so wave w
// holds the rows with i + 2j + 4k = w, and its rows may be updated at once with the reference's
// result. Only the reference CG phase needs it; engines build it on first use.
struct WaveSchedule {
  std::vector<int> rows;   // coloured row numbers, wave by wave
  std::vector<int> start;  // waves + 1 offsets into rows
};
WaveSchedule plan_waves(const LevelLayout& layout);

// Local nonzeros of the reference matrix on this level (what the rating counts).
std::int64_t count_local_nonzeros(const LevelLayout& layout);

}  // namespace kiln::hpcg
