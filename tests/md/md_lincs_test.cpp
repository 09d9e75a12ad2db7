// LINCS for constraints = h-bonds on 1-propanol (OPLS-AA: a methyl's three C-H constraints share
// their carbon, the coupling LINCS's series expansion is for): the lengths it restores against the
// expansion order, the momentum it keeps, its virial against the constraint forces' own, and
// leap-frog with LINCS in NVE (energy conserved to second order in dt), on the CPU engine and,
// where a GPU is, the CUDA engine.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kiln/hpc/md/engine.h"
#include "kiln/hpc/md/lincs.h"
#include "kiln/runtime/backend.h"
#include "small_molecules.h"

namespace kiln::md {
namespace md_lincs_test {

namespace fs = std::filesystem;
const fs::path kData = fs::path(KILN_SOURCE_DIR) / "tests/md/data";

MdrunSetup constrained_propanol() {
  MdrunSetup s = md_test::molecule_in_a_box(md_test::kPropanol, kData / "nve_hbonds.mdp");
  return s;
}

TEST(Lincs, HBondsBecomeConstraints) {
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = constrained_propanol();
  // Seven C-H and one O-H of eleven bonds; C-C, C-C and C-O stay bonds.
  EXPECT_EQ(s.system.constraints.size(), 8u);
  EXPECT_EQ(s.system.bonds.size(), 3u);
  EXPECT_DOUBLE_EQ(s.system.constraints[0].length, 0.109);
  EXPECT_EQ(s.settings.degrees_of_freedom, 3 * 12 - 8 - 3);
}

TEST(Lincs, RestoresLengthsKeepsMomentumAndGivesTheConstraintVirial) {
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = constrained_propanol();
  const Vec3 box = s.initial.box;
  std::vector<Vec3> ref = s.initial.positions;
  Lincs exact(s.system, 12, 4);
  for (int k = 0; k < 5; ++k) exact.apply(std::vector<Vec3>(ref), ref, box, 0.002, nullptr);  // onto them first
  ASSERT_LT(exact.max_relative_deviation(ref, box), 1e-10);
  std::mt19937 rng(5);
  std::normal_distribution<double> step(0.0, 0.003);  // nm: a 2 fs step's thermal motion
  std::vector<Vec3> moved = ref;
  for (auto& p : moved)
    for (double& c : p) c += step(rng);
  double before = exact.max_relative_deviation(moved, box);
  double previous = before;
  for (int order : {2, 4, 8}) {
    Lincs lincs(s.system, order, 1);
    std::vector<Vec3> x = moved;
    const double dt = 0.002;
    Mat3 virial{};
    lincs.apply(ref, x, box, dt, &virial);
    const double deviation = lincs.max_relative_deviation(x, box);
    EXPECT_LT(deviation, previous) << "order " << order;  // the expansion converges
    previous = deviation;
    // Constraint forces f_a = m_a (x_a - moved_a) / dt^2 sum to zero and their virial is
    // sum ref_a (x) f_a (the molecule is whole: no images).
    Vec3 momentum{0, 0, 0};
    Mat3 expected{};
    for (int a = 0; a < s.system.atom_count; ++a) {
      const Vec3 f = (s.system.masses[a] / (dt * dt)) * (x[a] - moved[a]);
      momentum += f;
      add_outer(expected, ref[a], f);
    }
    for (int d = 0; d < 3; ++d) {
      EXPECT_NEAR(momentum[d], 0, 1e-6) << "order " << order;
      for (int e = 0; e < 3; ++e) EXPECT_NEAR(virial[d][e], expected[d][e], 1e-6 * std::abs(expected[d][e]) + 1e-6);
    }
  }
  EXPECT_GT(before, 1e-2);
  // GROMACS's defaults (order 4, one iteration) after a thermal step: well below 1e-3.
  EXPECT_LT(previous, 1e-5);
}

// NVE with LINCS: the conserved energy's fluctuation is second order in dt (leap-frog with exact
// constraints: the ratio 2 fs / 1 fs near 4; 4.2 on the CPU engine, and 4.0 from 1 fs to 0.5 fs),
// small against the potential energy's, and the
// constraint rmsd stays where GROMACS's is (1e-6 to 1e-5).
std::pair<double, double> nve_fluctuations(MdrunSetup s, double dt, bool gpu, double* worst_rmsd) {
  s.settings.mdp.dt = dt;
  s.settings.mdp.nsteps = static_cast<std::int64_t>(std::lround(0.4 / dt));  // 0.4 ps
  s.settings.mdp.nstenergy = static_cast<int>(std::lround(0.01 / dt));
  s.settings.gpu_double = true;
  auto engine =
      gpu ? make_cuda_engine(s.system, s.settings, s.initial) : make_cpu_engine(s.system, s.settings, s.initial);
  std::vector<double> conserved, potential;
  engine->run([&](const StepEnergies& e) {
    conserved.push_back(e.conserved);
    potential.push_back(e.potential);
    *worst_rmsd = std::max(*worst_rmsd, e.constr_rmsd);
  });
  auto stdev = [](const std::vector<double>& v) {
    double mean = 0, sq = 0;
    for (double x : v) mean += x / v.size();
    for (double x : v) sq += (x - mean) * (x - mean) / v.size();
    return std::sqrt(sq);
  };
  return {stdev(conserved), stdev(potential)};
}

class LincsNve : public ::testing::TestWithParam<bool> {};

TEST_P(LincsNve, ConservesEnergyToSecondOrder) {
  const bool gpu = GetParam();
  if (gpu && device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = constrained_propanol();
  double rmsd = 0;
  auto [c2, p2] = nve_fluctuations(s, 0.002, gpu, &rmsd);
  auto [c1, p1] = nve_fluctuations(s, 0.001, gpu, &rmsd);
  EXPECT_LT(c2, 0.2 * p2);  // 0.11 on the CPU engine
  EXPECT_GT(c2 / c1, 2.5);
  EXPECT_LT(c2 / c1, 6.0);
  EXPECT_LT(rmsd, 1e-4);
  EXPECT_GT(rmsd, 0);
}

// The CUDA engine's LINCS in double follows the CPU engine's step by step (40 steps, list every
// step): positions within 1e-9 nm and the same Constr. rmsd.
TEST(Lincs, CudaFollowsTheCpuEngineInDouble) {
  if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = constrained_propanol();
  s.settings.mdp.nsteps = 40;
  s.settings.mdp.nstenergy = 5;
  s.settings.mdp.nstlist = 1;
  s.settings.gpu_double = true;
  std::vector<StepEnergies> cpu, gpu;
  auto cpu_engine = make_cpu_engine(s.system, s.settings, s.initial);
  cpu_engine->run([&](const StepEnergies& e) { cpu.push_back(e); });
  auto gpu_engine = make_cuda_engine(s.system, s.settings, s.initial);
  gpu_engine->run([&](const StepEnergies& e) { gpu.push_back(e); });
  ASSERT_EQ(cpu.size(), gpu.size());
  for (std::size_t k = 0; k < cpu.size(); ++k) {
    EXPECT_NEAR(gpu[k].potential, cpu[k].potential, 1e-8 * std::abs(cpu[k].potential) + 1e-8);
    EXPECT_NEAR(gpu[k].constr_rmsd, cpu[k].constr_rmsd, 1e-3 * cpu[k].constr_rmsd + 1e-12);
  }
  const MdState a = cpu_engine->state(), b = gpu_engine->state();
  for (std::size_t i = 0; i < a.positions.size(); ++i) EXPECT_LT(norm(a.positions[i] - b.positions[i]), 1e-9);
}

INSTANTIATE_TEST_SUITE_P(Engines, LincsNve, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "cuda" : "cpu"); });

}  // namespace md_lincs_test
}  // namespace kiln::md
