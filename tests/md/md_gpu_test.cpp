// The CUDA engine of kiln mdrun against the CPU engine (the reference, itself checked against
// OpenMM and the Ewald sum): forces, energies and virial of one evaluation in double and mixed
// precision, a short run step by step in double, and NVE energy conservation in mixed precision.
// Skipped without a CUDA device.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <tuple>

#include "gromacs_data.h"
#include "kiln/hpc/md/cpu_engine.h"
#include "kiln/hpc/md/mdrun.h"
#include "kiln/hpc/md/topology.h"
#include "kiln/hpc/md/velocities.h"
#include "kiln/runtime/backend.h"

namespace kiln::md {
namespace md_gpu_test {

namespace fs = std::filesystem;
const fs::path kData = fs::path(KILN_SOURCE_DIR) / "tests/md/data";
const fs::path kSpc216 = kiln::md_test::gromacs_top() / "spc216.gro";

std::string skip_reason() {
  if (device_count(DeviceKind::CUDA) == 0) return "no CUDA device";
  if (!fs::exists(kSpc216) || !fs::exists(kiln::md_test::gromacs_top() / "oplsaa.ff"))
    return "gromacs-data is not installed";
  return "";
}

// spc216 replicated n x n x n (as gmx genconf -nbox n n n), velocities drawn anew at gen-temp: a
// box large enough for the 0.1 nm buffer and for several columns of the GPU's cluster grid.
MdrunSetup water_box(const std::string& mdp, int n) {
  MdrunSetup s = prepare_mdrun(kSpc216, kData / "topol.top", kData / mdp);
  if (n == 1) return s;
  fs::path top = fs::temp_directory_path() / fmt::format("kiln_md_gpu_{}.top", ::getpid());
  {
    std::ofstream out(top);
    out << "#include \"oplsaa.ff/forcefield.itp\"\n#include \"oplsaa.ff/spc.itp\"\n[ system ]\nreplica\n"
        << "[ molecules ]\nSOL " << 216 * n * n * n << "\n";
  }
  TopologyOptions topts;
  topts.defines = s.settings.mdp.defines;  // -DFLEXIBLE
  s.system = read_topology(top, topts);
  fs::remove(top);
  const Vec3 box = s.initial.box;
  std::vector<Vec3> x;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      for (int c = 0; c < n; ++c)
        for (const auto& p : s.initial.positions)
          x.push_back({p[0] + a * box[0], p[1] + b * box[1], p[2] + c * box[2]});
  s.initial.positions = x;
  s.initial.box = static_cast<double>(n) * box;
  s.initial.velocities = maxwell_velocities(s.system, s.settings.mdp.gen_vel ? s.settings.mdp.gen_temp : 0.0, 7);
  for (auto& k : s.settings.pme_grid) k *= n;
  s.settings.rlist = s.settings.cutoff + 0.1;
  s.settings.degrees_of_freedom = 3 * s.system.atom_count - s.system.constraint_count() - 3;
  return s;
}

double rms(const std::vector<Vec3>& f) {
  double sum = 0;
  for (const auto& v : f) sum += dot(v, v);
  return std::sqrt(sum / f.size());
}

class GpuForces : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

// One evaluation on the 2x2x2 replica (5184 atoms, 8 x 8 columns): every term, the forces and the
// virial trace against CpuForceField. Double precision differs only by summation order and the
// device's erfc/exp (a few ulp): 1e-9. Mixed precision: float pair and PME arithmetic (erfcf is
// within 4 ulp, each pair term ~3e-7 relative; PME spreads and transforms in float), energies
// summed in double, so the terms agree to ~1e-6 relative and the forces to ~1e-5 of their rms;
// the bounds leave a factor of 10.
TEST_P(GpuForces, MatchTheCpuForceField) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const auto [mdp, use_double] = GetParam();
  MdrunSetup s = water_box(mdp, 2);
  s.settings.gpu_double = use_double;
  CpuForceField cpu(s.system, s.settings);
  cpu.build_pair_list(s.initial.positions, s.initial.box);
  std::vector<Vec3> f_cpu;
  StepEnergies e_cpu;
  cpu.compute(s.initial.positions, s.initial.box, f_cpu, e_cpu);
  GpuForceResult gpu = cuda_force_evaluation(s.system, s.settings, s.initial.positions, s.initial.box);
  const double rel = use_double ? 1e-9 : 2e-5;
  auto expect_term = [&](const char* name, double g, double c, double scale) {
    EXPECT_NEAR(g, c, rel * std::max(std::abs(c), scale)) << name;
  };
  const double scale = std::abs(e_cpu.coulomb_sr);  // the largest term: what rounding scales with
  expect_term("LJ (SR)", gpu.energies.lj, e_cpu.lj, 0.1 * scale);
  expect_term("Coulomb (SR)", gpu.energies.coulomb_sr, e_cpu.coulomb_sr, scale);
  expect_term("Coul. recip.", gpu.energies.coulomb_recip, e_cpu.coulomb_recip, 0.1 * scale);
  expect_term("Bond", gpu.energies.bond, e_cpu.bond, 1e-3 * scale);
  expect_term("Angle", gpu.energies.angle, e_cpu.angle, 1e-3 * scale);
  expect_term("Potential", gpu.energies.potential, e_cpu.potential, scale);
  double trace = 0;
  for (int k = 0; k < 3; ++k) trace += cpu.virial()[k][k];
  expect_term("virial", gpu.virial_trace, trace, scale);
  std::vector<Vec3> diff(f_cpu.size());
  for (std::size_t i = 0; i < f_cpu.size(); ++i) diff[i] = gpu.forces[i] - f_cpu[i];
  EXPECT_LT(rms(diff), (use_double ? 1e-9 : 1e-4) * rms(f_cpu));
  EXPECT_GT(gpu.cluster_pairs, 0u);
}

INSTANTIATE_TEST_SUITE_P(Electrostatics, GpuForces,
                         ::testing::Combine(::testing::Values("step0.mdp", "nve.mdp", "step0_flexible.mdp",
                                                              "step0_reaction_field.mdp"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           std::string name = fs::path(std::get<0>(info.param)).stem().string();
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name + (std::get<1>(info.param) ? "_double" : "_mixed");
                         });

// The same run on the CPU engine and the CUDA engine: their energy frames, and the engines (for
// their final states and counters).
struct BothEngines {
  std::vector<StepEnergies> cpu, gpu;
  std::unique_ptr<MdEngine> cpu_engine, gpu_engine;
};

BothEngines run_on_both_engines(const MdrunSetup& s) {
  BothEngines r;
  r.cpu_engine = make_cpu_engine(s.system, s.settings, s.initial);
  r.cpu_engine->run([&](const StepEnergies& e) { r.cpu.push_back(e); });
  r.gpu_engine = make_cuda_engine(s.system, s.settings, s.initial);
  r.gpu_engine->run([&](const StepEnergies& e) { r.gpu.push_back(e); });
  return r;
}

// The conserved energy's least-squares drift in kJ/mol/ns per atom, checked against the 5 kJ/mol/ns
// per atom the buffer is sized for, and its largest excursion from the start against 0.2% of the
// kinetic energy (+ 5 kJ/mol); returns the drift.
double expect_bounded_drift(const std::vector<StepEnergies>& energies, int atom_count) {
  const StepEnergies& first = energies.front();
  double n = static_cast<double>(energies.size()), st = 0, se = 0, stt = 0, ste = 0, max_dev = 0;
  for (const auto& e : energies) {
    st += e.time;
    se += e.conserved;
    stt += e.time * e.time;
    ste += e.time * e.conserved;
    max_dev = std::max(max_dev, std::abs(e.conserved - first.conserved));
  }
  const double drift = (n * ste - st * se) / (n * stt - st * st) * 1000 / atom_count;
  EXPECT_LT(std::abs(drift), 5.0) << "drift " << drift << " kJ/mol/ns/atom";
  EXPECT_LT(max_dev, 0.002 * std::abs(first.kinetic) + 5.0);
  return drift;
}

// The same run on both engines, with the list rebuilt every step (the CPU engine's early rebuilds
// then never happen) and v-rescale drawing from the same seed: in double precision the energies
// agree step by step, to what 40 steps of chaotic dynamics make of rounding differences. The
// 216-water box: one column grid spanning the whole box, every cluster pair within rlist.
TEST(CudaEngine, FollowsTheCpuEngineInDouble) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  MdrunSetup s = water_box("nve.mdp", 1);
  s.settings.mdp.nsteps = 40;
  s.settings.mdp.nstenergy = 5;
  s.settings.mdp.nstlist = 1;
  s.settings.mdp.nstcomm = 10;
  s.settings.mdp.tcoupl = Thermostat::VRescale;
  s.settings.mdp.tau_t = 0.1;
  s.settings.mdp.ref_t = 350;
  s.settings.mdp.ld_seed = 11;
  s.settings.gpu_double = true;
  const BothEngines r = run_on_both_engines(s);
  const std::vector<StepEnergies>&cpu = r.cpu, &gpu = r.gpu;
  ASSERT_EQ(cpu.size(), gpu.size());
  for (std::size_t k = 0; k < cpu.size(); ++k) {
    const double scale = std::abs(cpu[k].potential);
    EXPECT_EQ(gpu[k].step, cpu[k].step);
    EXPECT_NEAR(gpu[k].potential, cpu[k].potential, 1e-7 * scale) << "step " << cpu[k].step;
    EXPECT_NEAR(gpu[k].kinetic, cpu[k].kinetic, 1e-7 * scale) << "step " << cpu[k].step;
    EXPECT_NEAR(gpu[k].conserved, cpu[k].conserved, 1e-7 * scale) << "step " << cpu[k].step;
    EXPECT_NEAR(gpu[k].pressure, cpu[k].pressure, 1e-3 * std::max(1.0, std::abs(cpu[k].pressure)))
        << "step " << cpu[k].step;
  }
  const MdState a = r.cpu_engine->state(), b = r.gpu_engine->state();
  double worst = 0;
  for (std::size_t i = 0; i < a.positions.size(); ++i) worst = std::max(worst, norm(a.positions[i] - b.positions[i]));
  EXPECT_LT(worst, 1e-8);  // nm
}

// c-rescale with v-rescale on the 2x2x2 replica in double: the barostat draws from the same
// generator after the thermostat in both engines, so box and energies follow the CPU engine's.
TEST(CudaEngine, FollowsTheCpuEngineWithCRescale) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  MdrunSetup s = water_box("crescale.mdp", 2);
  s.settings.mdp.nsteps = 40;
  s.settings.mdp.nstlist = 1;
  s.settings.gpu_double = true;
  const BothEngines r = run_on_both_engines(s);
  const std::vector<StepEnergies>&cpu = r.cpu, &gpu = r.gpu;
  ASSERT_EQ(cpu.size(), gpu.size());
  for (std::size_t k = 0; k < cpu.size(); ++k) {
    const double scale = std::abs(cpu[k].potential);
    EXPECT_NEAR(gpu[k].potential, cpu[k].potential, 1e-7 * scale) << "step " << cpu[k].step;
    EXPECT_NEAR(gpu[k].pressure, cpu[k].pressure, 1e-3 * std::max(1.0, std::abs(cpu[k].pressure)))
        << "step " << cpu[k].step;
    for (int d = 0; d < 3; ++d) EXPECT_NEAR(gpu[k].box[d], cpu[k].box[d], 1e-9) << "step " << cpu[k].step;
  }
  EXPECT_NE(r.cpu_engine->state().box[0], s.initial.box[0]);  // the box did move
  EXPECT_NEAR(r.gpu_engine->state().box[0], r.cpu_engine->state().box[0], 1e-9);
}

// DispCorr = EnerPres on the GPU: the correction is the same host-side function of the volume as on the
// CPU, so one evaluation (mixed and double) has the CPU's Disper. corr. and Pres. DC to the bit and its
// potential includes it; the c-rescale run in double follows the CPU engine's with the correction in
// the pressure that drives the box.
TEST(CudaEngine, FollowsTheCpuEngineWithDispCorrAndCRescale) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  MdrunSetup s = water_box("crescale.mdp", 2);
  s.settings.mdp.dispcorr = DispCorr::EnerPres;
  s.settings.mdp.nsteps = 40;
  s.settings.mdp.nstlist = 1;
  CpuForceField field(s.system, s.settings);
  field.build_pair_list(s.initial.positions, s.initial.box);
  std::vector<Vec3> f_cpu;
  StepEnergies e_cpu;
  field.compute(s.initial.positions, s.initial.box, f_cpu, e_cpu);
  ASSERT_LT(e_cpu.disp_corr, 0);
  for (bool use_double : {false, true}) {
    s.settings.gpu_double = use_double;
    GpuForceResult one = cuda_force_evaluation(s.system, s.settings, s.initial.positions, s.initial.box);
    EXPECT_TRUE(one.energies.has_dispcorr);
    EXPECT_EQ(one.energies.disp_corr, e_cpu.disp_corr);
    EXPECT_EQ(one.energies.pres_dc, e_cpu.pres_dc);
    EXPECT_NEAR(one.energies.potential, e_cpu.potential, (use_double ? 1e-9 : 2e-5) * std::abs(e_cpu.potential));
  }
  const BothEngines r = run_on_both_engines(s);
  const std::vector<StepEnergies>&cpu = r.cpu, &gpu = r.gpu;
  ASSERT_EQ(cpu.size(), gpu.size());
  for (std::size_t k = 0; k < cpu.size(); ++k) {
    const double scale = std::abs(cpu[k].potential);
    EXPECT_TRUE(gpu[k].has_dispcorr);
    EXPECT_NEAR(gpu[k].disp_corr, cpu[k].disp_corr, 1e-9 * std::abs(cpu[k].disp_corr)) << "step " << cpu[k].step;
    EXPECT_NEAR(gpu[k].pres_dc, cpu[k].pres_dc, 1e-9 * std::abs(cpu[k].pres_dc)) << "step " << cpu[k].step;
    EXPECT_NEAR(gpu[k].potential, cpu[k].potential, 1e-7 * scale) << "step " << cpu[k].step;
    EXPECT_NEAR(gpu[k].pressure, cpu[k].pressure, 1e-3 * std::max(1.0, std::abs(cpu[k].pressure)))
        << "step " << cpu[k].step;
    for (int d = 0; d < 3; ++d) EXPECT_NEAR(gpu[k].box[d], cpu[k].box[d], 1e-9) << "step " << cpu[k].step;
  }
  EXPECT_NE(r.cpu_engine->state().box[0], s.initial.box[0]);
}

// NVE in mixed precision: 300 steps (0.6 ps) of the 2x2x2 replica with GROMACS's scheme (list
// every 10 steps, 0.1 nm buffer). The bounds are the CPU engine's NVE test's: drift below the
// 5 kJ/mol/ns per atom GROMACS's default buffer tolerance aims at, fluctuations of a 2 fs step.
TEST(CudaEngine, ConservesEnergyInMixedPrecision) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  MdrunSetup s = water_box("nve.mdp", 2);
  s.settings.mdp.nsteps = 300;
  s.settings.mdp.nstenergy = 10;
  std::vector<StepEnergies> energies;
  auto engine = make_cuda_engine(s.system, s.settings, s.initial);
  engine->run([&](const StepEnergies& e) { energies.push_back(e); });
  ASSERT_EQ(energies.size(), 31u);
  const auto& first = energies.front();
  EXPECT_NEAR(first.temperature, 300.0, 15.0);
  expect_bounded_drift(energies, s.system.atom_count);
  const MdState end = engine->state();
  for (int o = 0; o < s.system.atom_count; o += 3)
    EXPECT_NEAR(norm(min_image(end.positions[o + 1] - end.positions[o], end.box)), 0.1, 1e-6);
  EXPECT_EQ(engine->counters().pair_list_builds, 31);  // the start, then after every 10th step
}

// Dynamic pruning never drops an interacting pair: the outer list is built at x0 (rlist rc + 0.1),
// every atom is moved by at most 0.01 nm to x1 (so each pair within rc at x1 was within rc + 0.02
// at x0, inside the outer list), the inner list is pruned at x1 with rlist_inner rc + 0.02, and the
// forces at x1 from the pruned list are the CPU engine's exact ones (double: 1e-9), with no atom
// pair within rc in a pruned-away cluster pair, and fewer cluster pairs than the outer list.
TEST(CudaEngine, PruningKeepsEveryInteractingPair) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  MdrunSetup s = water_box("step0.mdp", 2);
  s.settings.gpu_double = true;
  s.settings.nstlist_prune = 4;
  s.settings.prune_parts = 2;
  s.settings.rlist_inner = s.settings.cutoff + 0.02;
  const std::vector<Vec3> x0 = s.initial.positions;
  std::vector<Vec3> x1 = x0;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  for (auto& p : x1) {
    Vec3 d{u(rng), u(rng), u(rng)};
    const double len = norm(d);
    if (len > 0) p = p + (0.01 * u(rng) / len) * d;  // at most 0.01 nm
  }
  CpuForceField cpu(s.system, s.settings);
  cpu.build_pair_list(x1, s.initial.box);
  std::vector<Vec3> f_cpu;
  StepEnergies e_cpu;
  cpu.compute(x1, s.initial.box, f_cpu, e_cpu);
  GpuForceResult gpu = cuda_force_evaluation(s.system, s.settings, x1, s.initial.box, &x0);
  const double scale = std::abs(e_cpu.coulomb_sr);
  EXPECT_NEAR(gpu.energies.lj, e_cpu.lj, 1e-9 * scale);
  EXPECT_NEAR(gpu.energies.coulomb_sr, e_cpu.coulomb_sr, 1e-9 * scale);
  EXPECT_NEAR(gpu.energies.potential, e_cpu.potential, 1e-9 * scale);
  std::vector<Vec3> diff(f_cpu.size());
  for (std::size_t i = 0; i < f_cpu.size(); ++i) diff[i] = gpu.forces[i] - f_cpu[i];
  EXPECT_LT(rms(diff), 1e-9 * rms(f_cpu));
  EXPECT_EQ(gpu.pruned_pairs_in_cutoff, 0);
  EXPECT_GT(gpu.inner_cluster_pairs, 0u);
  EXPECT_LT(gpu.inner_cluster_pairs, gpu.cluster_pairs);
}

// The run loop with pruning: outer list every 10 steps at rc + 0.3 nm, the inner list (rc + 0.12)
// pruned in 2 rolling parts, each every 4 steps; buffers far beyond what 8 and 18 fs of motion use
// up, so the GPU engine in double follows the CPU engine (exact list) step by step, and the energy
// steps' check finds no interacting pair that pruning dropped.
TEST(CudaEngine, FollowsTheCpuEngineWithPruning) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  MdrunSetup s = water_box("nve.mdp", 2);
  s.settings.mdp.nsteps = 40;
  s.settings.mdp.nstenergy = 5;
  s.settings.mdp.nstlist = 10;
  s.settings.mdp.tcoupl = Thermostat::VRescale;
  s.settings.mdp.ref_t = 300;
  s.settings.mdp.ld_seed = 11;
  s.settings.rlist = s.settings.cutoff + 0.3;
  s.settings.nstlist_prune = 4;
  s.settings.prune_parts = 2;
  s.settings.rlist_inner = s.settings.cutoff + 0.12;
  s.settings.gpu_double = true;
  const BothEngines r = run_on_both_engines(s);
  const std::vector<StepEnergies>&cpu = r.cpu, &gpu = r.gpu;
  ASSERT_EQ(cpu.size(), gpu.size());
  for (std::size_t k = 0; k < cpu.size(); ++k) {
    const double scale = std::abs(cpu[k].potential);
    EXPECT_NEAR(gpu[k].potential, cpu[k].potential, 1e-7 * scale) << "step " << cpu[k].step;
    EXPECT_NEAR(gpu[k].conserved, cpu[k].conserved, 1e-7 * scale) << "step " << cpu[k].step;
  }
  const EngineCounters c = r.gpu_engine->counters();
  EXPECT_EQ(c.pair_list_builds, 5);  // steps 0, 10, 20, 30, 40
  EXPECT_EQ(c.prunes, 5 + 4 * 4);    // a full prune at each build, a part at steps 2, 4, 6, 8 after it
  EXPECT_EQ(c.pruned_pairs_in_cutoff, 0);
  EXPECT_EQ(c.buffer_exceeded_steps, 0);
  EXPECT_LT(c.inner_cluster_pairs, c.cluster_pairs);
}

// gmx mdrun's GPU set-up on the 2x2x2 replica in mixed precision, NVE from 300 K (GROMACS keeps
// the .mdp's nstlist in NVE; here -nstlist 100 as its GPU default would be with a thermostat):
// rlist and the inner list from the buffer estimate, rolling pruning. The drift stays below the
// tolerance the buffer is sized for (5 kJ/mol/ns per atom, as the test above without pruning).
TEST(CudaEngine, ConservesEnergyWithGromacsPrunedLists) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  MdrunSetup s = water_box("nve.mdp", 2);
  s.settings.mdp.nsteps = 400;
  s.settings.mdp.nstenergy = 10;
  plan_gpu_pair_lists(s, 100, true);
  ASSERT_EQ(s.settings.mdp.nstlist, 100);
  ASSERT_GT(s.settings.nstlist_prune, 0);
  ASSERT_LT(s.settings.rlist_inner, s.settings.rlist);
  std::vector<StepEnergies> energies;
  auto engine = make_cuda_engine(s.system, s.settings, s.initial);
  engine->run([&](const StepEnergies& e) { energies.push_back(e); });
  ASSERT_EQ(energies.size(), 41u);
  const double drift = expect_bounded_drift(energies, s.system.atom_count);
  const EngineCounters c = engine->counters();
  EXPECT_EQ(c.pair_list_builds, 5);  // steps 0, 100, 200, 300, 400
  EXPECT_GT(c.prunes, 5);
  EXPECT_LT(c.inner_cluster_pairs, c.cluster_pairs);
  fmt::print(
      "nstlist {} rlist {:.3f}, prune every {} steps in {} parts at {:.3f}: {} of {} cluster pairs kept, "
      "{} pruned pairs within rc at energy steps, drift {:.3f} kJ/mol/ns per atom\n",
      s.settings.mdp.nstlist, s.settings.rlist, s.settings.nstlist_prune, s.settings.prune_parts,
      s.settings.rlist_inner, c.inner_cluster_pairs, c.cluster_pairs, c.pruned_pairs_in_cutoff, drift);
}

// The energy frames of `resumed` (from its checkpoint's step on) against those of `whole` at the same
// steps, and the final boxes: in double, to what 20 steps of chaotic dynamics make of the rounding
// the atomic force sums differ by.
void expect_same_continuation(const std::vector<StepEnergies>& whole, const std::vector<StepEnergies>& resumed,
                              const MdState& a, const MdState& b) {
  ASSERT_FALSE(resumed.empty());
  std::size_t k0 = 0;
  while (k0 < whole.size() && whole[k0].step < resumed.front().step) ++k0;
  ASSERT_EQ(whole.size() - k0, resumed.size());
  for (std::size_t k = 0; k < resumed.size(); ++k) {
    const StepEnergies &x = whole[k0 + k], &y = resumed[k];
    const double scale = std::abs(x.potential);
    ASSERT_EQ(x.step, y.step);
    EXPECT_NEAR(y.potential, x.potential, 1e-7 * scale) << "step " << x.step;
    EXPECT_NEAR(y.kinetic, x.kinetic, 1e-7 * scale) << "step " << x.step;
    EXPECT_NEAR(y.conserved, x.conserved, 1e-7 * scale) << "step " << x.step;
    for (int d = 0; d < 3; ++d) EXPECT_NEAR(y.box[d], x.box[d], 1e-9) << "step " << x.step;
  }
  for (int d = 0; d < 3; ++d) EXPECT_NEAR(b.box[d], a.box[d], 1e-9);
  double worst = 0;
  for (std::size_t i = 0; i < a.positions.size(); ++i) worst = std::max(worst, norm(a.positions[i] - b.positions[i]));
  EXPECT_LT(worst, 1e-7);  // nm
}

// v-rescale and c-rescale in double on the 2x2x2 replica with the list kept for 10 steps: the run
// checkpoints at steps 20 and 40 (its last), and a run resumed from the step-20 checkpoint (list,
// box, generators, thermostat work carried) continues as the uninterrupted one did.
TEST(CudaEngine, ResumesFromItsCheckpoint) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  MdrunSetup s = water_box("crescale.mdp", 2);
  s.settings.mdp.nsteps = 40;
  s.settings.gpu_double = true;
  s.settings.checkpoint_steps = 20;
  std::vector<std::int64_t> written;
  std::shared_ptr<EngineCheckpoint> at20;
  s.settings.on_checkpoint = [&](const EngineCheckpoint& c) {
    written.push_back(c.next_step);
    if (c.next_step == 20) at20 = std::make_shared<EngineCheckpoint>(c);
  };
  std::vector<StepEnergies> whole, resumed;
  auto a = make_cuda_engine(s.system, s.settings, s.initial);
  a->run([&](const StepEnergies& e) { whole.push_back(e); });
  ASSERT_EQ(written, (std::vector<std::int64_t>{20, 40}));
  ASSERT_TRUE(at20);
  EXPECT_NE(at20->box[0], s.initial.box[0]);  // c-rescale moved the box before the checkpoint
  EXPECT_NE(at20->thermostat_work, 0.0);
  MdrunSetup r = s;
  r.settings.checkpoint_steps = 0;
  r.settings.on_checkpoint = nullptr;
  r.settings.resume = at20;
  auto b = make_cuda_engine(r.system, r.settings, r.initial);
  b->run([&](const StepEnergies& e) { resumed.push_back(e); });
  EXPECT_EQ(resumed.front().step, 20);
  expect_same_continuation(whole, resumed, a->state(), b->state());
}

// The engines share the file: a CPU engine's checkpoint continues on the GPU, and the GPU's on the
// CPU, each as the CPU engine's uninterrupted run (double precision, list rebuilt every step so the
// CPU engine makes no early rebuild the GPU one would not).
TEST(CudaEngine, ContinuesACpuCheckpoint) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  MdrunSetup s = water_box("crescale.mdp", 2);
  s.settings.mdp.nsteps = 40;
  s.settings.mdp.nstlist = 1;
  s.settings.gpu_double = true;
  s.settings.checkpoint_steps = 20;
  std::shared_ptr<EngineCheckpoint> cpu20, gpu20;
  auto keep = [](std::shared_ptr<EngineCheckpoint>& into) {
    return [&into](const EngineCheckpoint& c) {
      if (c.next_step == 20) into = std::make_shared<EngineCheckpoint>(c);
    };
  };
  std::vector<StepEnergies> whole, on_gpu, on_cpu;
  s.settings.on_checkpoint = keep(cpu20);
  auto a = make_cpu_engine(s.system, s.settings, s.initial);
  a->run([&](const StepEnergies& e) { whole.push_back(e); });
  s.settings.on_checkpoint = keep(gpu20);
  make_cuda_engine(s.system, s.settings, s.initial)->run([](const StepEnergies&) {});
  ASSERT_TRUE(cpu20 && gpu20);
  EXPECT_EQ(cpu20->generators, gpu20->generators);  // the same draws, in the same order

  MdrunSetup r = s;
  r.settings.checkpoint_steps = 0;
  r.settings.on_checkpoint = nullptr;
  r.settings.resume = cpu20;
  auto b = make_cuda_engine(r.system, r.settings, r.initial);
  b->run([&](const StepEnergies& e) { on_gpu.push_back(e); });
  expect_same_continuation(whole, on_gpu, a->state(), b->state());
  r.settings.resume = gpu20;
  auto c = make_cpu_engine(r.system, r.settings, r.initial);
  c->run([&](const StepEnergies& e) { on_cpu.push_back(e); });
  expect_same_continuation(whole, on_cpu, a->state(), c->state());
}

}  // namespace md_gpu_test
}  // namespace kiln::md
