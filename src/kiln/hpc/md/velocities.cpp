#include "kiln/hpc/md/velocities.h"

#include <cmath>
#include <random>

#include "kiln/hpc/md/units.h"

namespace kiln::md {

double kinetic_energy(const MdSystem& s, const std::vector<Vec3>& v) {
  double ke = 0;
  for (int i = 0; i < s.atom_count; ++i) ke += 0.5 * s.masses[i] * dot(v[i], v[i]);
  return ke;
}

void remove_com_velocity(const MdSystem& s, std::vector<Vec3>& v) {
  Vec3 p{0, 0, 0};
  double m = 0;
  for (int i = 0; i < s.atom_count; ++i) {
    p += s.masses[i] * v[i];
    m += s.masses[i];
  }
  Vec3 vcom = (1 / m) * p;
  for (auto& vi : v) vi -= vcom;
}

std::vector<Vec3> maxwell_velocities(const MdSystem& s, double temperature, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss(0.0, 1.0);
  std::vector<Vec3> v(s.atom_count);
  for (int i = 0; i < s.atom_count; ++i) {
    double sd = std::sqrt(kBoltzmann * temperature / s.masses[i]);
    for (int k = 0; k < 3; ++k) v[i][k] = sd * gauss(rng);
  }
  remove_com_velocity(s, v);
  double t = 2 * kinetic_energy(s, v) / (3.0 * s.atom_count * kBoltzmann);
  if (t > 0) {
    double scale = std::sqrt(temperature / t);
    for (auto& vi : v) vi = scale * vi;
  }
  return v;
}

}  // namespace kiln::md
