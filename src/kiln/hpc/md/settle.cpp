#include "kiln/hpc/md/settle.h"

#include <cmath>

#include "kiln/hpc/md/settle_water.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

void settle_positions(const MdSystem& s, const std::vector<Vec3>& ref, std::vector<Vec3>& x, const Vec3& box) {
  for (const SettleWater& w : s.settles) {
    const int o = w.o, h1 = o + 1, h2 = o + 2;
    // Work relative to the oxygen so waters split by the box edge stay whole.
    const Vec3 b0 = min_image(ref[h1] - ref[o], box), c0 = min_image(ref[h2] - ref[o], box);
    const Vec3 b1 = min_image(x[h1] - x[o], box), c1 = min_image(x[h2] - x[o], box);
    Vec3 new_o, new_h1, new_h2;
    SettleFailure failure =
        settle_water(b0.data(), c0.data(), b1.data(), c1.data(), {s.masses[o], s.masses[h1], w.d_oh, w.d_hh},
                     new_o.data(), new_h1.data(), new_h2.data());
    KILN_CHECK(failure != SettleFailure::Degenerate, "SETTLE: water at atom {} is degenerate (collinear atoms)",
               s.atom_number(o));
    KILN_CHECK(failure != SettleFailure::TooFar,
               "SETTLE: water at atom {} moved too far in one step to be constrained (is dt too large, "
               "or are atoms overlapping?)",
               s.atom_number(o));
    KILN_CHECK(failure == SettleFailure::None, "SETTLE: water at atom {} cannot be constrained", s.atom_number(o));
    const Vec3 origin = x[o];
    x[o] = origin + new_o;
    x[h1] = origin + new_h1;
    x[h2] = origin + new_h2;
  }
}

Mat3 settle_virial(const MdSystem& s, const std::vector<Vec3>& ref, const std::vector<Vec3>& unconstrained,
                   const std::vector<Vec3>& constrained, const Vec3& box, double dt) {
  Mat3 w{};
  for (const SettleWater& water : s.settles)
    for (int a = water.o; a < water.o + 3; ++a)
      add_outer(w, min_image(ref[a] - ref[water.o], box), constrained[a] - unconstrained[a], s.masses[a] / (dt * dt));
  return w;
}

}  // namespace kiln::md
