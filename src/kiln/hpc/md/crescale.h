#pragma once
// Stochastic cell rescaling (Bernetti and Bussi, J. Chem. Phys. 153, 114107 (2020)), isotropic, as
// GROMACS's pcoupl = c-rescale: every nstpcouple steps the log-volume moves by
//   d ln V = -(compressibility / tau_p) (P_ref - P) dt' + sqrt(2 kT compressibility dt' / (V tau_p)) dW
// (dt' = nstpcouple dt, P the instantaneous scalar pressure), so coordinates and the box are scaled
// by mu = exp(d ln V / 3) and velocities by 1 / mu.
#include <cmath>
#include <cstdint>

#include "kiln/hpc/md/units.h"
#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

struct CRescale {
  double tau_p = 1.0;            // ps
  double ref_p = 1.0;            // bar
  double compressibility = 0.0;  // 1/bar
  int nstpcouple = 10;
};

// The linear scaling factor mu for one coupling step at pressure `pressure` (bar), volume (nm^3),
// reference temperature ref_t (K) and a standard normal draw.
inline double crescale_mu(const CRescale& c, double coupling_dt, double pressure, double volume, double ref_t,
                          double gauss) {
  const double factor = c.compressibility * coupling_dt / c.tau_p;  // 1/bar
  const double kt = kBoltzmann * ref_t;                             // kJ/mol
  const double d_ln_v = -factor * (c.ref_p - pressure) + std::sqrt(2 * kt * factor * kPressureFactor / volume) * gauss;
  return std::exp(d_ln_v / 3);
}

// The pair list's minimum image needs every box edge at least twice rlist: a box that c-rescale
// shrank below that stops the run (throws kiln::Error naming the step).
void check_box_after_scaling(const Vec3& box, double rlist, std::int64_t step);

}  // namespace kiln::md
