#pragma once
// Physical constants in GROMACS's units (nm, ps, amu, kJ/mol, e, K), from the 2019 SI values that
// GROMACS 2022 derives them from, so energies agree with gmx to the last printed digit.
#include <numbers>

namespace kiln::md {

inline constexpr double kAvogadro = 6.02214076e23;
inline constexpr double kAtomicMassUnitKg = 1e-3 / kAvogadro;  // 1 g/mol per particle
inline constexpr double kBoltzmannSI = 1.380649e-23;           // J/K
// kJ/(mol K): GROMACS's BOLTZ (RGAS / KILO).
inline constexpr double kBoltzmann = kBoltzmannSI * kAvogadro / 1e3;
inline constexpr double kElementaryCharge = 1.602176634e-19;  // C
inline constexpr double kEpsilon0SI = 8.8541878128e-12;       // F/m
// Vacuum permittivity in e^2 mol / (kJ nm), then the Coulomb prefactor f = 1/(4 pi eps0) = 138.935...
inline constexpr double kEpsilon0 = (kEpsilon0SI * 1e-9 * 1e3) / (kElementaryCharge * kElementaryCharge * kAvogadro);
inline constexpr double kCoulombFactor = 1.0 / (4.0 * std::numbers::pi * kEpsilon0);
// kJ mol^-1 nm^-3 in bar: GROMACS's PRESFAC (16.6054...).
inline constexpr double kPressureFactor = 1e3 / kAvogadro / 1e-27 / 1e5;

}  // namespace kiln::md
