// DispCorr, GROMACS's long-range dispersion correction (dispersion_correction.h): <C6> and <C12> against
// an all-pairs count in float64 on SPC water and on the villin headpiece in water (many LJ types,
// exclusions inside the protein), the energy and pressure against the formulas written out here, the
// terms in the engine's potential and pressure, and c-rescale responding to Pres. DC.
// (OpenMM's own correction is compared in md_openmm_spc216_dispcorr: openmm_reference.py --dispcorr.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numbers>

#include "gromacs_data.h"
#include "kiln/hpc/md/cpu_engine.h"
#include "kiln/hpc/md/dispersion_correction.h"
#include "kiln/hpc/md/gro_file.h"
#include "kiln/hpc/md/mdrun.h"
#include "kiln/hpc/md/topology.h"
#include "kiln/hpc/md/units.h"

namespace kiln::md {
namespace md_dispcorr_test {

namespace fs = std::filesystem;
const fs::path kData = fs::path(KILN_SOURCE_DIR) / "tests/md/data";
const fs::path kSpc216 = kiln::md_test::gromacs_top() / "spc216.gro";
constexpr double kPi = std::numbers::pi;

bool have_gromacs_data() { return fs::exists(kSpc216) && fs::exists(kiln::md_test::gromacs_top() / "oplsaa.ff"); }

// A sum of many terms to the last bit or so (Neumaier's compensated summation): the villin box has
// 35 million pairs, whose plain running sum would be off by up to 1e-9 relative.
struct ExactSum {
  double sum = 0, carry = 0;
  void add(double x) {
    const double t = sum + x;
    carry += std::abs(sum) >= std::abs(x) ? (sum - t) + x : (x - t) + sum;
    sum = t;
  }
  double value() const { return sum + carry; }
};

// GROMACS's averages the slow way: every atom pair i < j that is not excluded.
struct PairAverages {
  double c6 = 0, c12 = 0, pairs = 0;
};
PairAverages all_pairs(const MdSystem& s, bool skip_excluded) {
  ExactSum c6, c12;
  double pairs = 0;
  const int nt = s.type_count;
  for (int i = 0; i < s.atom_count; ++i)
    for (int j = i + 1; j < s.atom_count; ++j) {
      if (skip_excluded && s.excluded(i, j)) continue;
      c6.add(s.c6[s.types[i] * nt + s.types[j]]);
      c12.add(s.c12[s.types[i] * nt + s.types[j]]);
      pairs += 1;
    }
  return {c6.value() / pairs, c12.value() / pairs, pairs};
}

// The correction as the GROMACS manual derives it, written independently of dispersion_correction.cpp:
// the tail beyond rc, -(2/3) pi N rho <C6> / rc^3 (+ (2/9) pi N rho <C12> / rc^9), plus the
// potential-shift's constant taken back for each of the rho (4/3) pi rc^3 - 1 neighbours every atom
// has inside rc (the shift added +C6/rc^6 and -C12/rc^12 per pair; N/2 pairs per neighbour count).
DispersionCorrection::Terms expected(int n, double volume, double rc, double c6, double c12, bool all, bool pressure) {
  const double rho = n / volume, inside = rho * 4.0 / 3.0 * kPi * std::pow(rc, 3) - 1;
  DispersionCorrection::Terms t;
  t.energy = -2.0 / 3.0 * kPi * n * rho * c6 / std::pow(rc, 3) - 0.5 * n * inside * c6 / std::pow(rc, 6);
  if (all) t.energy += 2.0 / 9.0 * kPi * n * rho * c12 / std::pow(rc, 9) + 0.5 * n * inside * c12 / std::pow(rc, 12);
  if (pressure) {
    t.pressure = -4.0 / 3.0 * kPi * rho * rho * c6 / std::pow(rc, 3);
    if (all) t.pressure += 8.0 / 9.0 * kPi * rho * rho * c12 / std::pow(rc, 9);
    t.pressure *= kPressureFactor;
  }
  return t;
}

TEST(DispersionCorrection, SpcWaterAsTheFormulas) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  const MdSystem s = read_topology(kData / "topol.top");
  const GroFrame gro = read_gro(kSpc216);
  const double volume = gro.box[0] * gro.box[1] * gro.box[2], rc = 0.9;
  const PairAverages a = all_pairs(s, true);
  // Only OW-OW pairs have LJ in SPC. Of the 3M (3M - 1) / 2 pairs of M waters, 3M are excluded
  // (O-H, O-H, H-H in each), leaving 9 M (M - 1) / 2: nine times the M (M - 1) / 2 O-O pairs, so
  // <C6> is C6(OW, OW) / 9 exactly.
  const double c6_oo = s.c6[s.types[0] * s.type_count + s.types[0]];
  EXPECT_NEAR(a.c6, c6_oo / 9, 1e-15);
  EXPECT_EQ(a.pairs, 9.0 * 216 * 215 / 2);
  for (DispCorr mode : {DispCorr::EnerPres, DispCorr::Ener, DispCorr::AllEnerPres, DispCorr::AllEner}) {
    const DispersionCorrection dc(s, mode, rc);
    EXPECT_TRUE(dc.enabled());
    EXPECT_NEAR(dc.average_c6(), a.c6, 1e-12 * a.c6);
    EXPECT_NEAR(dc.average_c12(), a.c12, 1e-12 * a.c12);
    EXPECT_EQ(dc.averaged_pairs(), a.pairs);
    const bool all = mode == DispCorr::AllEnerPres || mode == DispCorr::AllEner;
    const bool pressure = mode == DispCorr::EnerPres || mode == DispCorr::AllEnerPres;
    // At the box's volume and at a box 10% larger in volume (c-rescale changes it every coupling step).
    for (double v : {volume, 1.1 * volume}) {
      const auto want = expected(s.atom_count, v, rc, a.c6, a.c12, all, pressure);
      const auto got = dc.at(v);
      EXPECT_NEAR(got.energy, want.energy, 1e-12 * std::abs(want.energy));
      EXPECT_NEAR(got.pressure, want.pressure, 1e-12 * std::abs(want.pressure));
      if (!pressure) {
        EXPECT_EQ(got.pressure, 0.0);
      }
    }
  }
  // The sizes for 216 SPC waters at rc 0.9 nm: -108.49 kJ/mol (-54.33 of it the tail beyond rc) and
  // -279.49 bar (docs/mdrun.md; openmm_reference.py --dispcorr gets the same from OpenMM's correction).
  const auto t = DispersionCorrection(s, DispCorr::EnerPres, rc).at(volume);
  EXPECT_NEAR(t.energy, -108.4908, 1e-4);
  EXPECT_NEAR(t.pressure, -279.4925, 1e-4);
  EXPECT_EQ(DispersionCorrection(s, DispCorr::No, rc).at(volume).energy, 0.0);
  EXPECT_FALSE(DispersionCorrection(s, DispCorr::No, rc).enabled());
}

// Many LJ types and a molecule with nrexcl = 3 exclusions: the type-count sums less the excluded
// pairs equal the pair-by-pair average, and leaving the exclusions in would change it.
TEST(DispersionCorrection, VillinInWaterAveragesOverNonExcludedPairs) {
  if (!have_gromacs_data() || !fs::exists(kiln::md_test::gromacs_top() / "amber99sb-ildn.ff"))
    GTEST_SKIP() << "gromacs-data is not installed";
  const MdSystem s = read_topology(kData / "villin/topol.top");
  ASSERT_GT(s.type_count, 5);
  const PairAverages a = all_pairs(s, true), with_excluded = all_pairs(s, false);
  const DispersionCorrection dc(s, DispCorr::AllEnerPres, 1.0);
  EXPECT_NEAR(dc.average_c6(), a.c6, 1e-12 * a.c6);
  EXPECT_NEAR(dc.average_c12(), a.c12, 1e-12 * a.c12);
  EXPECT_EQ(dc.averaged_pairs(), a.pairs);
  EXPECT_GT(std::abs(with_excluded.c6 / a.c6 - 1), 1e-5);
  const GroFrame gro = read_gro(kData / "villin/conf.gro");
  const double volume = gro.box[0] * gro.box[1] * gro.box[2];
  const auto want = expected(s.atom_count, volume, 1.0, a.c6, a.c12, true, true);
  EXPECT_NEAR(dc.at(volume).energy, want.energy, 1e-11 * std::abs(want.energy));
  EXPECT_NEAR(dc.at(volume).pressure, want.pressure, 1e-11 * std::abs(want.pressure));
}

std::map<std::string, double> terms(const StepEnergies& e, const MdSystem& s) {
  std::map<std::string, double> m;
  for (const auto& [name, value] : named_terms(e, s)) m[name] = value;
  return m;
}

// In the force field's potential, listed as GROMACS lists them, and nowhere else.
TEST(DispersionCorrection, InThePotentialAndTheEnergyTerms) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = prepare_mdrun(kSpc216, kData / "topol.top", kData / "step0.mdp");
  EngineSettings with = s.settings;
  with.mdp.dispcorr = DispCorr::EnerPres;
  StepEnergies e_no, e_dc;
  std::vector<Vec3> f_no, f_dc;
  CpuForceField no(s.system, s.settings), dc(s.system, with);
  no.build_pair_list(s.initial.positions, s.initial.box);
  dc.build_pair_list(s.initial.positions, s.initial.box);
  no.compute(s.initial.positions, s.initial.box, f_no, e_no);
  dc.compute(s.initial.positions, s.initial.box, f_dc, e_dc);
  const double volume = s.initial.box[0] * s.initial.box[1] * s.initial.box[2];
  const auto want = DispersionCorrection(s.system, DispCorr::EnerPres, 0.9).at(volume);
  EXPECT_EQ(e_dc.lj, e_no.lj);
  EXPECT_EQ(e_dc.disp_corr, want.energy);
  EXPECT_EQ(e_dc.pres_dc, want.pressure);
  EXPECT_NEAR(e_dc.potential - e_no.potential, want.energy, 1e-9);
  EXPECT_EQ(f_dc, f_no);                // a function of the volume only: no forces
  EXPECT_EQ(no.virial(), dc.virial());  // Pres. DC is added to the pressure, not to the force virial
  // GROMACS's order: "Disper. corr." after "LJ (SR)", "Pres. DC" before "Pressure".
  auto names = named_terms(e_dc, s.system);
  std::vector<std::string> order;
  for (const auto& t : names) order.push_back(t.first);
  auto at = [&](const char* n) { return std::find(order.begin(), order.end(), n) - order.begin(); };
  EXPECT_EQ(at("Disper. corr."), at("LJ (SR)") + 1);
  EXPECT_EQ(at("Pres. DC"), at("Pressure") - 1);
  EXPECT_EQ(terms(e_no, s.system).count("Disper. corr."), 0u);
  EXPECT_EQ(terms(e_no, s.system).count("Pres. DC"), 0u);
}

// A c-rescale run (crescale.mdp: v-rescale 300 K, tau-p 0.1 ps every 5 steps, 200 steps of 2 fs) with and
// without EnerPres from the same start and seeds: the pressure at step 0 differs by exactly Pres. DC, the
// first coupling step scales the box by exactly exp(compressibility dt' / tau-p Pres. DC / 3) more, and
// the box keeps shrinking further: the density comes out higher by about compressibility x 279 bar.
TEST(DispersionCorrection, CRescaleRunFeelsPresDC) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = prepare_mdrun(kSpc216, kData / "topol.top", kData / "crescale.mdp");
  // rlist is capped at half the box (0.931 nm), which would stop any shrinking at once; 0.91 nm keeps
  // the list exact (kiln rebuilds early) and lets the box shrink 2%.
  s.settings.rlist = 0.91;
  s.settings.mdp.nstenergy = 5;  // every coupling step
  std::vector<std::map<std::string, double>> frames[2];
  for (int k = 0; k < 2; ++k) {
    EngineSettings settings = s.settings;
    if (k == 1) settings.mdp.dispcorr = DispCorr::EnerPres;
    auto engine = make_cpu_engine(s.system, settings, s.initial);
    engine->run([&](const StepEnergies& e) { frames[k].push_back(terms(e, s.system)); });
  }
  const auto &no = frames[0], &dc = frames[1];
  ASSERT_EQ(no.size(), 41u);
  ASSERT_EQ(dc.size(), 41u);
  const double v0 = no[0].at("Volume");
  const auto want = DispersionCorrection(s.system, DispCorr::EnerPres, 0.9).at(v0);
  EXPECT_EQ(no[0].count("Pres. DC"), 0u);
  EXPECT_NEAR(dc[0].at("Pres. DC"), want.pressure, 1e-9);
  EXPECT_NEAR(dc[0].at("Disper. corr."), want.energy, 1e-9);
  EXPECT_NEAR(dc[0].at("Pressure") - no[0].at("Pressure"), want.pressure, 1e-6);
  EXPECT_NEAR(dc[0].at("Potential") - no[0].at("Potential"), want.energy, 1e-6);
  // Step 5 reports the box after step 0's coupling (the same noise draw in both runs).
  const CRescale& c = s.settings.mdp.crescale;
  const double dt_coupling = c.nstpcouple * s.settings.mdp.dt;
  EXPECT_NEAR(std::log(dc[1].at("Box-X") / no[1].at("Box-X")),
              c.compressibility * dt_coupling / c.tau_p * want.pressure / 3, 1e-12);
  // Every later frame: Pres. DC follows the volume (rho^2), and the box stays smaller.
  double mean_ratio = 0;
  for (std::size_t k = 1; k < dc.size(); ++k) {
    const auto t = DispersionCorrection(s.system, DispCorr::EnerPres, 0.9).at(dc[k].at("Volume"));
    EXPECT_NEAR(dc[k].at("Pres. DC"), t.pressure, 1e-9);
    EXPECT_NEAR(dc[k].at("Disper. corr."), t.energy, 1e-9);
    EXPECT_GT(dc[k].at("Density"), no[k].at("Density")) << "step " << 5 * k;
    if (k > dc.size() / 2) mean_ratio += dc[k].at("Density") / no[k].at("Density") / (dc.size() / 2);
  }
  // Measured 1.0065 over the second 0.2 ps (983.7 vs 982.5 kg/m^3 at step 5, 1010.6 vs 1002.4 at step
  // 200): two tau-p into the run, on the way to compressibility x 279 bar = 1.3% at equilibrium.
  EXPECT_GT(mean_ratio, 1.003);
  EXPECT_LT(mean_ratio, 1.02);
}

}  // namespace md_dispcorr_test
}  // namespace kiln::md
