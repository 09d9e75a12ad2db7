// Torsions and 1-4 pairs from real force-field files: 1-propanol (OPLS-AA's 1propanol.itp: RB
// dihedrals, [ pairs ] generated with fudgeLJ 0.5) and urea (AMBER99SB-ILDN's urea.itp: function 9
// dihedrals with several terms, function 4 impropers; the [ angles ] and [ pairs ] it lacks added
// as in solvate_molecule.py), alone in a 3 nm box. The CPU engine's forces against finite
// differences of its energy, the parameters grompp's lookups give, and the CUDA engine's terms and
// forces against the CPU engine's (skipped without a GPU). The energies themselves are compared
// with OpenMM's in the md_openmm_propanol_oplsaa and md_openmm_urea_* tests (CMakeLists.txt).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "kiln/hpc/md/cpu_engine.h"
#include "kiln/hpc/md/mdrun.h"
#include "kiln/runtime/backend.h"
#include "small_molecules.h"

namespace kiln::md {
namespace md_listed_test {

namespace fs = std::filesystem;
const fs::path kData = fs::path(KILN_SOURCE_DIR) / "tests/md/data";

using md_test::have_force_fields;
using md_test::kPropanol;
using md_test::kUrea;
using md_test::Molecule;

MdrunSetup molecule_in_a_box(const Molecule& m) {
  return md_test::molecule_in_a_box(m, kData / "step0_reaction_field.mdp");
}

class ListedForces : public ::testing::TestWithParam<const Molecule*> {};

TEST_P(ListedForces, AreMinusTheEnergyGradient) {
  if (!have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = molecule_in_a_box(*GetParam());
  CpuForceField ff(s.system, s.settings);
  const auto& x = s.initial.positions;
  ff.build_pair_list(x, s.initial.box);
  std::vector<Vec3> f;
  StepEnergies e;
  ff.compute(x, s.initial.box, f, e);
  EXPECT_NE(e.lj14, 0);
  EXPECT_NE(e.coulomb14, 0);
  EXPECT_NE(e.rb_dih + e.proper_dih, 0);
  const double h = 1e-6;
  for (int atom = 0; atom < s.system.atom_count; ++atom)
    for (int k = 0; k < 3; ++k) {
      std::vector<Vec3> scratch;
      StepEnergies ep, em;
      auto xp = x, xm = x;
      xp[atom][k] += h;
      xm[atom][k] -= h;
      ff.compute(xp, s.initial.box, scratch, ep);
      ff.compute(xm, s.initial.box, scratch, em);
      double numeric = -(ep.potential - em.potential) / (2 * h);
      EXPECT_NEAR(f[atom][k], numeric, 1e-4 * std::max(1.0, std::abs(numeric))) << "atom " << atom << " dim " << k;
    }
  // The virial of the listed terms alone: minus the strain derivative of their energy (the
  // molecule is far from its images, so only the listed terms and its own pairs contribute).
  const Mat3 virial = ff.virial();
  for (int d = 0; d < 3; ++d) {
    double energies[2];
    for (int sign = 0; sign < 2; ++sign) {
      const double lambda = sign == 0 ? 1 + h : 1 - h;
      auto xs = x;
      for (auto& p : xs) p[d] *= lambda;
      Vec3 bs = s.initial.box;
      bs[d] *= lambda;
      std::vector<Vec3> scratch;
      StepEnergies es;
      ff.compute(xs, bs, scratch, es);
      energies[sign] = es.potential;
    }
    const double numeric = -(energies[0] - energies[1]) / (2 * h);
    EXPECT_NEAR(virial[d][d], numeric, 1e-5 * std::abs(numeric) + 1e-4) << "dimension " << d;
  }
}

INSTANTIATE_TEST_SUITE_P(ForceFields, ListedForces, ::testing::Values(&kPropanol, &kUrea),
                         [](const auto& info) { return std::string(info.param->name); });

// What grompp's lookups give for these files (the numbers in oplsaa.ff/ffbonded.itp,
// ffnonbonded.itp and amber99sb-ildn.ff/ffbonded.itp).
TEST(ListedParameters, AsGromppLooksThemUp) {
  if (!have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup p = molecule_in_a_box(kPropanol);
  ASSERT_EQ(p.system.bonds.size(), 11u);
  EXPECT_DOUBLE_EQ(p.system.bonds[0].b0, 0.109);  // CT-HC
  EXPECT_DOUBLE_EQ(p.system.bonds[0].kb, 284512.0);
  ASSERT_EQ(p.system.rb_dihedrals.size(), 21u);
  // HC-CT-CT-HC: 0.62760 1.88280 0 -2.51040 0 0.
  EXPECT_DOUBLE_EQ(p.system.rb_dihedrals[0].c[0], 0.62760);
  EXPECT_DOUBLE_EQ(p.system.rb_dihedrals[0].c[3], -2.51040);
  ASSERT_EQ(p.system.pairs.size(), 21u);
  // Atoms 2 (opls_156 HC) and 6: generated, sigma 0.25 nm, epsilon 0.12552 kJ/mol, times fudgeLJ 0.5;
  // charges 0.06 * 0.06 times fudgeQQ 0.5.
  const double s6 = std::pow(0.25, 6);
  EXPECT_NEAR(p.system.pairs[0].c6, 0.5 * 4 * 0.12552 * s6, 1e-15);
  EXPECT_NEAR(p.system.pairs[0].c12, 0.5 * 4 * 0.12552 * s6 * s6, 1e-20);
  EXPECT_NEAR(p.system.pairs[0].qq, 0.5 * 0.06 * 0.06, 1e-15);
  MdrunSetup u = molecule_in_a_box(kUrea);
  // Eight function-9 lines: the four O-C-N-H match "H N C O" backwards (two terms on adjacent
  // lines), the four N-C-N-H only "X C N X" (one term); impropers "X X C O" and "X X N H".
  EXPECT_EQ(u.system.periodic_impropers.size(), 3u);
  ASSERT_EQ(u.system.proper_dihedrals.size(), 12u);
  EXPECT_EQ(u.system.proper_dihedrals[0].n, 2);
  EXPECT_DOUBLE_EQ(u.system.proper_dihedrals[0].k_phi, 10.46);
  EXPECT_EQ(u.system.proper_dihedrals[1].n, 1);
  EXPECT_DOUBLE_EQ(u.system.proper_dihedrals[1].k_phi, 8.368);
  EXPECT_NEAR(u.system.pairs[0].qq, 0.8333 * -0.613359 * 0.395055, 1e-12);
}

TEST(ListedParameters, MissingDihedralTypeIsNamed) {
  if (!have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  Molecule bad = kPropanol;
  std::string top = std::string(kPropanol.top);
  top.replace(top.find("[ system ]"), 0, "[ dihedrals ]\n 2 1 5 6 1\n");
  bad.top = top.c_str();
  try {
    molecule_in_a_box(bad);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("no [ dihedraltypes ] entry for bond types HC-CT-CT-HC (function 1)"),
              std::string::npos)
        << e.what();
  }
}

// The CUDA engine's torsion and 1-4 terms against the CPU engine's, in double (summation order
// only: 1e-9) and mixed precision (the listed terms run in double on the device; forces are
// accumulated in float: 1e-5 of their rms).
class GpuListedForces : public ::testing::TestWithParam<std::tuple<const Molecule*, bool>> {};

TEST_P(GpuListedForces, MatchTheCpuForceField) {
  if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  if (!have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  const auto [molecule, use_double] = GetParam();
  MdrunSetup s = molecule_in_a_box(*molecule);
  s.settings.gpu_double = use_double;
  CpuForceField cpu(s.system, s.settings);
  cpu.build_pair_list(s.initial.positions, s.initial.box);
  std::vector<Vec3> f_cpu;
  StepEnergies c;
  cpu.compute(s.initial.positions, s.initial.box, f_cpu, c);
  GpuForceResult gpu = cuda_force_evaluation(s.system, s.settings, s.initial.positions, s.initial.box);
  const StepEnergies& g = gpu.energies;
  const double rel = use_double ? 1e-9 : 1e-5;
  const double scale = std::abs(c.coulomb14) + std::abs(c.coulomb_sr);
  EXPECT_NEAR(g.proper_dih, c.proper_dih, rel * scale);
  EXPECT_NEAR(g.improper_dih, c.improper_dih, rel * scale);
  EXPECT_NEAR(g.rb_dih, c.rb_dih, rel * scale);
  EXPECT_NEAR(g.lj14, c.lj14, rel * scale);
  EXPECT_NEAR(g.coulomb14, c.coulomb14, rel * scale);
  EXPECT_NEAR(g.potential, c.potential, rel * scale);
  double trace = 0, f2 = 0, d2 = 0;
  for (int k = 0; k < 3; ++k) trace += cpu.virial()[k][k];
  EXPECT_NEAR(gpu.virial_trace, trace, rel * scale);
  for (std::size_t i = 0; i < f_cpu.size(); ++i) {
    f2 += dot(f_cpu[i], f_cpu[i]);
    Vec3 d = gpu.forces[i] - f_cpu[i];
    d2 += dot(d, d);
  }
  EXPECT_LT(std::sqrt(d2), (use_double ? 1e-9 : 1e-5) * std::sqrt(f2));
}

INSTANTIATE_TEST_SUITE_P(ForceFields, GpuListedForces,
                         ::testing::Combine(::testing::Values(&kPropanol, &kUrea), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)->name) +
                                  (std::get<1>(info.param) ? "_double" : "_mixed");
                         });

}  // namespace md_listed_test
}  // namespace kiln::md
