#pragma once
// Short-range non-bonded forces over the Verlet pair list, as GROMACS's Verlet kernels define
// them: Lennard-Jones with potential-shift and Ewald real-space Coulomb (erfc) with
// potential-shift, both cut at rc; the Ewald corrections for excluded pairs (-qq erf(beta r)/r)
// and the self term (-beta/sqrt(pi) q^2) also go into Coulomb (SR), as in GROMACS.
#include <vector>

#include "kiln/hpc/md/md_system.h"
#include "kiln/hpc/md/pair_list.h"
#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

struct NonbondedSettings {
  double cutoff = 1.0;  // rc = rvdw = rcoulomb, nm
  double beta = 3.12;   // Ewald coefficient, 1/nm
  int threads = 1;      // CPU threads for the pair loop
  // Reaction-field instead of Ewald: V = f qq (1/r + k_rf r^2 - c_rf) within rc; excluded pairs
  // keep f qq (k_rf r^2 - c_rf) and each atom -f q^2 c_rf / 2, as GROMACS's Verlet kernels.
  bool reaction_field = false;
  double k_rf = 0, c_rf = 0;
  // Domain decomposition (domain_decomposition.h): atoms [0, home_count) are this rank's, the rest
  // its halo. Only pairs with a home first atom are computed; a home-halo pair is computed on both
  // ranks, so each counts half its energy and virial and keeps the force on its home atom alone.
  // The exclusion corrections and self terms are the home atoms'. -1: every atom is home.
  int home_count = -1;
};

struct ShortRangeEnergies {
  double lj = 0;       // LJ (SR)
  double coulomb = 0;  // Coulomb (SR)
  Mat3 virial{};       // sum over pairs of r_ij (x) F_j, kJ/mol
};

// Adds the forces to `forces` and returns the energies. Non-excluded atoms closer than 0.001 nm are
// refused, naming both (overlapping atoms would give infinite forces).
ShortRangeEnergies compute_short_range(const MdSystem& system, const PairList& list, const NonbondedSettings& settings,
                                       const std::vector<Vec3>& x, const Vec3& box, std::vector<Vec3>& forces);

}  // namespace kiln::md
