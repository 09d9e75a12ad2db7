#include "kiln/hpc/md/dispersion_correction.h"

#include <fmt/format.h>

#include <numbers>
#include <vector>

#include "kiln/hpc/md/units.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

namespace {

bool corrects_c12(DispCorr m) { return m == DispCorr::AllEner || m == DispCorr::AllEnerPres; }
bool corrects_pressure(DispCorr m) { return m == DispCorr::EnerPres || m == DispCorr::AllEnerPres; }

const char* mode_name(DispCorr m) {
  switch (m) {
    case DispCorr::No: return "no";
    case DispCorr::EnerPres: return "EnerPres";
    case DispCorr::Ener: return "Ener";
    case DispCorr::AllEnerPres: return "AllEnerPres";
    case DispCorr::AllEner: return "AllEner";
  }
  return "?";
}

}  // namespace

DispersionCorrection::DispersionCorrection(const MdSystem& s, DispCorr mode, double cutoff)
    : mode_(mode), cutoff_(cutoff), atoms_(s.atom_count) {
  if (mode == DispCorr::No) return;
  KILN_CHECK(cutoff > 0, "dispersion correction: the cut-off must be positive, not {}", cutoff);
  // Sums over type pairs from the type counts (N^2 pairs would be slow for a million atoms), in
  // double as the pair counts pass 2^53 only beyond 10^8 atoms.
  const int nt = s.type_count;
  std::vector<double> count(nt, 0.0);
  for (int t : s.types) count[t] += 1;
  double c6 = 0, c12 = 0, pairs = 0;
  for (int a = 0; a < nt; ++a)
    for (int b = a; b < nt; ++b) {
      const double n = a == b ? count[a] * (count[a] - 1) / 2 : count[a] * count[b];
      c6 += n * s.c6[a * nt + b];
      c12 += n * s.c12[a * nt + b];
      pairs += n;
    }
  // Excluded pairs out, each once (the lists are symmetric).
  for (int i = 0; i < s.atom_count; ++i)
    for (int j : s.exclusions[i]) {
      if (j <= i) continue;
      const int k = s.types[i] * nt + s.types[j];
      c6 -= s.c6[k];
      c12 -= s.c12[k];
      pairs -= 1;
    }
  pairs_ = pairs;
  // GROMACS: no pairs left (one atom, or one molecule with everything excluded), no correction.
  if (pairs > 0) {
    average_c6_ = c6 / pairs;
    average_c12_ = c12 / pairs;
  }
}

DispersionCorrection::Terms DispersionCorrection::at(double volume) const {
  Terms t;
  if (mode_ == DispCorr::No) return t;
  constexpr double pi = std::numbers::pi;
  const double rc3 = cutoff_ * cutoff_ * cutoff_, rc6 = rc3 * rc3, rc9 = rc6 * rc3;
  const double half_n = 0.5 * atoms_, density = atoms_ / volume;
  // Missing beyond rc plus the potential-shift over the sphere inside it (see the header), less the
  // self pair the sphere integral counts.
  const double tail6 = -4 * pi / (3 * rc3), inside6 = -4 * pi / (3 * rc3), shift6 = -1 / rc6;
  t.energy = half_n * average_c6_ * (density * (tail6 + inside6) - shift6);
  if (corrects_c12(mode_)) {
    const double tail12 = 4 * pi / (9 * rc9), inside12 = 4 * pi / (3 * rc9), shift12 = 1 / (rc6 * rc6);
    t.energy += half_n * average_c12_ * (density * (tail12 + inside12) - shift12);
  }
  if (corrects_pressure(mode_)) {
    // P = -(2 pi / 3) rho^2 integral_rc^inf r^3 dV/dr dr: -(4/3) pi rho^2 <C6> / rc^3 for -C6/r^6,
    // +(8/9) pi rho^2 <C12> / rc^9 for C12/r^12 (kJ/mol/nm^3, then bar).
    double p = -4 * pi / 3 * density * density * average_c6_ / rc3;
    if (corrects_c12(mode_)) p += 8 * pi / 9 * density * density * average_c12_ / rc9;
    t.pressure = kPressureFactor * p;
  }
  return t;
}

std::string DispersionCorrection::describe() const {
  if (mode_ == DispCorr::No) return "dispersion correction: none (DispCorr = no)";
  std::string text =
      fmt::format("dispersion correction: DispCorr = {}, <C6> {:.4e} kJ/mol nm^6", mode_name(mode_), average_c6_);
  if (corrects_c12(mode_)) text += fmt::format(", <C12> {:.4e} kJ/mol nm^12", average_c12_);
  text += fmt::format(" over {:.0f} non-excluded atom pairs, rc {} nm", pairs_, cutoff_);
  if (average_c6_ == 0 && average_c12_ == 0) text += " (no atom pairs to correct: the correction is 0)";
  return text;
}

}  // namespace kiln::md
