#pragma once
// GROMACS's long-range dispersion correction (.mdp DispCorr): the Lennard-Jones energy and pressure
// that the cut-off leaves out, for a homogeneous fluid (pair distribution g(r) = 1), as GROMACS's
// DispersionCorrection computes it. With N atoms in volume V (rho = N / V), cut-off rc and the
// average pair coefficients <C6>, <C12> (N/2 because each pair belongs to two atoms):
//   E = (N/2) <C6>  (rho e6  - s6)   [+ (N/2) <C12> (rho e12 - s12) with AllEner*]
// where e6, e12 integrate 4 pi r^2 times the part of -1/r^6, 1/r^12 the kernels do not compute:
// beyond rc, -4 pi/(3 rc^3) and 4 pi/(9 rc^9), and, because vdw-modifier = Potential-shift adds
// +1/rc^6 (-1/rc^12) to every pair inside rc, the shift integrated over the sphere, -4 pi/(3 rc^3)
// and 4 pi/(3 rc^9). That sphere holds rho 4 pi rc^3 / 3 atoms counting the atom at its centre,
// which the kernels never pair with itself: s6 = -1/rc^6, s12 = 1/rc^12 take that one back out.
// The pressure comes from the forces only (the shift is a constant, no force): the virial of the
// missing tail, P = -(4/3) pi rho^2 <C6> / rc^3 [+ (8/9) pi rho^2 <C12> / rc^9 with AllEnerPres],
// added with EnerPres and AllEnerPres; Ener and AllEner leave the pressure alone (Pres. DC = 0).
//
// <C6> (and <C12>) average over GROMACS's pair set: every pair of distinct atoms i < j, less the
// excluded pairs (bonded neighbours within nrexcl, settles, [ exclusions ]), which GROMACS drops so
// that type combinations that never interact cannot weigh in. GROMACS rounds rc up to its
// dispersion table's spacing (1/500 nm in mixed precision, 1/2000 in double) for the potential-shift
// case; kiln uses rc itself, the same number for any cut-off on that spacing (0.9, 1.0, 1.2 nm ...).
#include <string>

#include "kiln/hpc/md/md_system.h"
#include "kiln/hpc/md/mdp_options.h"

namespace kiln::md {

class DispersionCorrection {
 public:
  struct Terms {
    double energy = 0;    // kJ/mol, "Disper. corr."
    double pressure = 0;  // bar, "Pres. DC"
  };

  DispersionCorrection(const MdSystem& system, DispCorr mode, double cutoff);

  bool enabled() const { return mode_ != DispCorr::No; }
  // The correction in a box of this volume (nm^3); zero with DispCorr = no.
  Terms at(double volume) const;
  double average_c6() const { return average_c6_; }    // kJ/mol nm^6
  double average_c12() const { return average_c12_; }  // kJ/mol nm^12
  double averaged_pairs() const { return pairs_; }     // N (N - 1) / 2 less the excluded pairs
  // One line for md.log: the mode, <C6> (and <C12>) as GROMACS's "Long Range LJ corr." line.
  std::string describe() const;

 private:
  DispCorr mode_;
  double cutoff_;
  int atoms_;
  double average_c6_ = 0, average_c12_ = 0, pairs_ = 0;
};

}  // namespace kiln::md
