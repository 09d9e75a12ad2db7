#pragma once
// Kinetic energy, centre-of-mass motion and Maxwell-Boltzmann velocities (gen-vel).
#include <cstdint>
#include <vector>

#include "kiln/hpc/md/md_system.h"
#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

double kinetic_energy(const MdSystem& system, const std::vector<Vec3>& v);
void remove_com_velocity(const MdSystem& system, std::vector<Vec3>& v);
// Velocities from a Maxwell-Boltzmann distribution at `temperature`, without centre-of-mass motion,
// scaled so that their temperature over 3N degrees of freedom is exactly `temperature` (as
// GROMACS's grompp does); seeded, so the same seed gives the same velocities.
std::vector<Vec3> maxwell_velocities(const MdSystem& system, double temperature, std::uint64_t seed);

}  // namespace kiln::md
