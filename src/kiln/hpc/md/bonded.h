#pragma once
// The listed (bonded) interactions: harmonic bonds and angles (function 1 of [ bonds ] and
// [ angles ]), periodic proper dihedrals (1, 9), periodic impropers (4), Ryckaert-Bellemans
// dihedrals (3) and the 1-4 pairs of [ pairs ].
#include <vector>

#include "kiln/hpc/md/md_system.h"
#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

struct BondedEnergies {
  double bond = 0;                                      // "Bond"
  double angle = 0;                                     // "Angle"
  double proper_dih = 0, rb_dih = 0, improper_dih = 0;  // "Proper Dih.", "Ryckaert-Bell.", "Per. Imp. Dih."
  double lj14 = 0, coulomb14 = 0;                       // "LJ-14", "Coulomb-14"
  Mat3 virial{};  // sum of r (x) F over each term's atoms, relative to one of them
};

BondedEnergies compute_bonded(const MdSystem& system, const std::vector<Vec3>& x, const Vec3& box,
                              std::vector<Vec3>& forces);

}  // namespace kiln::md
