#pragma once
// The stochastic velocity-rescaling thermostat (Bussi, Donadio and Parrinello 2007), split so the
// CPU and GPU engines share it: the random numbers are drawn on the host in one order (so a given
// ld-seed gives both engines the same thermostat), the scale factor is computed where the kinetic
// energy lives.
#include <math.h>

#include "kiln/hpc/md/host_device.h"

#if !defined(__CUDACC__)
#include <random>
#endif

namespace kiln::md {

struct VrescaleNoise {
  double r1 = 0;      // a standard Gaussian
  double sum_r2 = 0;  // the sum of ndf - 1 squared Gaussians: 2 Gamma((ndf - 1) / 2)
};

// The velocity scale factor for kinetic energy ke, reference ke_ref = ndf kT / 2 and
// factor = exp(-dt / tau_t); 1 when there is nothing to scale.
KILN_MD_HD double vrescale_lambda(double ke, double ke_ref, int ndf, double factor, VrescaleNoise noise) {
  if (ke <= 0 || ndf <= 0) return 1.0;
  const double ke_new = ke + (1 - factor) * (ke_ref * (noise.sum_r2 + noise.r1 * noise.r1) / ndf - ke) +
                        2 * noise.r1 * sqrt(ke_ref / ndf * ke * (1 - factor) * factor);
  return sqrt(fmax(ke_new, 0.0) / ke);
}

#if !defined(__CUDACC__)
inline VrescaleNoise draw_vrescale_noise(std::mt19937_64& rng, int ndf) {
  VrescaleNoise n;
  n.r1 = std::normal_distribution<double>(0.0, 1.0)(rng);
  if (ndf > 1) n.sum_r2 = 2 * std::gamma_distribution<double>(0.5 * (ndf - 1), 1.0)(rng);
  return n;
}
#endif

}  // namespace kiln::md
