#pragma once
// Harmonic bonds and angles (GROMACS function type 1 of [ bonds ] and [ angles ]), as used by
// flexible water models (define = -DFLEXIBLE).
#include <vector>

#include "kiln/hpc/md/md_system.h"
#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

struct BondedEnergies {
  double bond = 0;   // "Bond"
  double angle = 0;  // "Angle"
  Mat3 virial{};     // sum of r (x) F over each term's atoms, relative to one of them
};

BondedEnergies compute_bonded(const MdSystem& system, const std::vector<Vec3>& x, const Vec3& box,
                              std::vector<Vec3>& forces);

}  // namespace kiln::md
