#pragma once
// PME parameters as grompp/mdrun derive them: the Ewald splitting coefficient beta from
// ewald-rtol and the cut-off, and the FFT grid from fourierspacing.
#include <array>

#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

// beta (1/nm) with erfc(beta * rc) = rtol, found by GROMACS's bisection (calc_ewaldcoeff_q).
double ewald_coefficient(double cutoff, double rtol);

// The smallest grid size >= box / spacing (and >= 2 * (order - 1)) from GROMACS's list of fast FFT
// sizes (calcFftGrid); `given` > 0 keeps that dimension as set by fourier-nx/ny/nz.
std::array<int, 3> pme_grid_size(const Vec3& box, double spacing, int pme_order, const std::array<int, 3>& given);

}  // namespace kiln::md
