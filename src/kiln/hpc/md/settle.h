#pragma once
// SETTLE (Miyamoto and Kollman 1992): the analytic solution that moves a rigid water's three atoms
// from their unconstrained positions back to the O-H and H-H distances, keeping the centre of mass
// and using the previous (constrained) positions as the reference for the rotation.
#include <vector>

#include "kiln/hpc/md/md_system.h"
#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

// `reference` holds the positions before the step (they satisfy the constraints), `updated` the
// unconstrained new ones, corrected in place. Waters may straddle the box: distances use the
// minimum image. Fails naming the water if the step moved it too far to be settled.
void settle_positions(const MdSystem& system, const std::vector<Vec3>& reference, std::vector<Vec3>& updated,
                      const Vec3& box);

// The virial sum r (x) f of the constraint forces f = m (constrained - unconstrained) / dt^2 that
// SETTLE applied, acting at the reference positions (for the pressure). They sum to zero per
// water, so positions relative to its oxygen are used and periodic images do not matter.
Mat3 settle_virial(const MdSystem& system, const std::vector<Vec3>& reference, const std::vector<Vec3>& unconstrained,
                   const std::vector<Vec3>& constrained, const Vec3& box, double dt);

}  // namespace kiln::md
