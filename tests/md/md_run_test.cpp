// kiln mdrun end to end on the CPU engine: NVE energy conservation with SETTLE, the thermostat
// holding its temperature, reproducible gen-vel, output files, and refusals of inputs that cannot
// run (a box smaller than twice the cut-off, overlapping atoms).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "gromacs_data.h"
#include "kiln/hpc/md/gro_file.h"
#include "kiln/hpc/md/mdrun.h"
#include "kiln/runtime/error.h"

namespace kiln::md {
namespace md_run_test {

namespace fs = std::filesystem;
const fs::path kData = fs::path(KILN_SOURCE_DIR) / "tests/md/data";
const fs::path kSpc216 = kiln::md_test::gromacs_top() / "spc216.gro";

bool have_gromacs_data() { return fs::exists(kSpc216) && fs::exists(kiln::md_test::gromacs_top() / "oplsaa.ff"); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

fs::path scratch(const std::string& name) {
  fs::path p = fs::temp_directory_path() / fmt::format("kiln_md_{}_{}", name, ::getpid());
  fs::create_directories(p);
  return p;
}

TEST(Mdrun, NveConservesEnergyWithSettle) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  auto setup = prepare_mdrun(kSpc216, kData / "topol.top", kData / "nve.mdp");
  setup.settings.mdp.nsteps = 250;  // 0.5 ps: a few seconds on one core
  setup.settings.mdp.nstenergy = 10;
  fs::path out = scratch("nve");
  auto r = run_mdrun(setup, out, nullptr);
  ASSERT_EQ(r.energies.size(), 26u);
  const auto& first = r.energies.front();
  EXPECT_NEAR(first.temperature, 300.0, 15.0);  // gen-temp 300 K, then the start is constrained
  // Linear fit of the conserved energy: drift per atom per ns, and the fluctuation around it.
  double n = r.energies.size(), st = 0, se = 0, stt = 0, ste = 0;
  for (const auto& e : r.energies) {
    st += e.time;
    se += e.conserved;
    stt += e.time * e.time;
    ste += e.time * e.conserved;
  }
  double slope = (n * ste - st * se) / (n * stt - st * st);  // kJ/mol/ps
  double drift = slope * 1000 / setup.system.atom_count;     // kJ/mol/ns per atom
  double max_dev = 0;
  for (const auto& e : r.energies) max_dev = std::max(max_dev, std::abs(e.conserved - first.conserved));
  // GROMACS's default verlet-buffer-tolerance targets 0.005 kJ/mol/ps per atom = 5 kJ/mol/ns; an
  // exact pair list with a double-precision engine does far better. The fluctuation of a 2 fs
  // step with rigid water is about 1e-4 of the kinetic energy... of order a few kJ/mol here.
  EXPECT_LT(std::abs(drift), 5.0) << "drift " << drift << " kJ/mol/ns/atom";
  EXPECT_LT(max_dev, 0.002 * std::abs(first.kinetic) + 5.0);
  // SPC water at its own density and 300 K: the mean pressure is near 1 bar, within the large
  // fluctuations of a 648-atom box (hundreds of bar); a wrong virial would be off by thousands.
  double pressure = 0;
  for (const auto& e : r.energies) pressure += e.pressure / r.energies.size();
  EXPECT_LT(std::abs(pressure), 1000.0) << "mean pressure " << pressure << " bar";
  // Rigid water stays rigid.
  GroFrame out_gro = read_gro(out / "confout.gro");
  for (int o = 0; o < 648; o += 3)
    EXPECT_NEAR(norm(min_image(out_gro.positions[o + 1] - out_gro.positions[o], out_gro.box)), 0.1, 1.5e-3);
  EXPECT_TRUE(fs::exists(out / "energy.json"));
  EXPECT_TRUE(fs::exists(out / "md.log"));
  EXPECT_GT(r.ns_per_day, 0);
  fs::remove_all(out);
}

TEST(Mdrun, ResetHalfwayTimesTheSecondHalfOnly) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  auto setup = prepare_mdrun(kSpc216, kData / "topol.top", kData / "nve.mdp");
  setup.settings.mdp.nsteps = 20;
  setup.settings.mdp.nstenergy = 6;  // frames at 0, 6, 12, 18, 20: the reset is at 12, the first at or after 10
  setup.reset_halfway = true;
  fs::path out = scratch("resethway");
  auto r = run_mdrun(setup, out, nullptr);
  EXPECT_EQ(r.timed_steps, 8);
  EXPECT_EQ(r.energies.size(), 5u);  // the frames are all still written
  EXPECT_GT(r.ns_per_day, 0);
  std::ifstream log(out / "md.log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("performance counted over steps 12 to 20 (--resethway)"), std::string::npos);
  // No frame between half-way and the last step: refused before anything runs, naming nstenergy.
  setup.settings.mdp.nstenergy = 15;  // frames at 0, 15, 20: 15 is in the second half, fine
  EXPECT_EQ(run_mdrun(setup, out, nullptr).timed_steps, 5);
  setup.settings.mdp.nstenergy = 1000;
  std::string message = error_of([&] { run_mdrun(setup, out, nullptr); });
  EXPECT_NE(message.find("--resethway"), std::string::npos) << message;
  EXPECT_NE(message.find("nstenergy 1000"), std::string::npos) << message;
  fs::remove_all(out);
}

TEST(Mdrun, VRescaleHoldsTheTemperatureAndGenVelIsSeeded) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  fs::path dir = scratch("vrescale");
  std::ifstream in(kData / "nve.mdp");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto set = [&](const std::string& line, const std::string& with) {
    size_t at = text.find(line);
    ASSERT_NE(at, std::string::npos) << line;
    text.replace(at, line.size(), with);
  };
  set("tcoupl          = no", "tcoupl = v-rescale\ntau-t = 0.1\nref-t = 350\nld-seed = 3");
  set("gen-temp        = 300", "gen-temp = 250");
  std::ofstream(dir / "nvt.mdp") << text;
  auto setup = prepare_mdrun(kSpc216, kData / "topol.top", dir / "nvt.mdp");
  auto again = prepare_mdrun(kSpc216, kData / "topol.top", dir / "nvt.mdp");
  EXPECT_EQ(setup.initial.velocities, again.initial.velocities);  // gen-seed 1993 both times
  setup.settings.mdp.nsteps = 300;
  setup.settings.mdp.nstenergy = 10;
  auto r = run_mdrun(setup, dir / "out", nullptr);
  double mean = 0;
  int count = 0;
  for (const auto& e : r.energies)
    if (e.time >= 0.3) {
      mean += e.temperature;
      ++count;
    }
  mean /= count;
  EXPECT_NEAR(mean, 350.0, 25.0);  // from 250 K to 350 K with tau-t 0.1 ps
  // The thermostat put in about 100 K worth of kinetic energy (~800 kJ/mol); the conserved
  // energy, which subtracts its work, stays put.
  const auto& first = r.energies.front();
  const auto& last = r.energies.back();
  EXPECT_GT(last.total - first.total, 400.0);
  EXPECT_LT(std::abs(last.conserved - first.conserved), 40.0);
  fs::remove_all(dir);
}

TEST(Mdrun, PairListBufferKeepsTheDynamicsOfAListRebuiltEveryStep) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  // The 216-water box, rlist capped at half of it (a 0.031 nm buffer): with nstlist 1000 only
  // the displacement check triggers rebuilds.
  auto setup = prepare_mdrun(kSpc216, kData / "topol.top", kData / "nve.mdp");
  auto every_step = setup;
  setup.settings.mdp.nsteps = every_step.settings.mdp.nsteps = 30;
  setup.settings.mdp.nstenergy = every_step.settings.mdp.nstenergy = 5;
  setup.settings.mdp.nstlist = 1000;
  every_step.settings.mdp.nstlist = 1;
  fs::path dir = scratch("buffer");
  auto lazy = run_mdrun(setup, dir / "lazy", nullptr);
  auto eager = run_mdrun(every_step, dir / "eager", nullptr);
  EXPECT_EQ(eager.counters.pair_list_builds, 31);
  EXPECT_LT(lazy.counters.pair_list_builds, 31);
  ASSERT_EQ(lazy.energies.size(), eager.energies.size());
  for (size_t k = 0; k < lazy.energies.size(); ++k) {
    // The same pairs within the cut-off every step: only the order of the sums differs.
    EXPECT_NEAR(lazy.energies[k].potential, eager.energies[k].potential, 1e-9 * std::abs(eager.energies[k].potential));
    EXPECT_NEAR(lazy.energies[k].kinetic, eager.energies[k].kinetic, 1e-9 * std::abs(eager.energies[k].kinetic));
  }
  fs::remove_all(dir);
}

TEST(Mdrun, RefusesABoxSmallerThanTwiceTheCutoff) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  fs::path dir = scratch("small_box");
  std::ofstream(dir / "long_cutoff.mdp") << "rcoulomb = 1.0\nrvdw = 1.0\n";
  EXPECT_NE(error_of([&] {
              prepare_mdrun(kSpc216, kData / "topol.top", dir / "long_cutoff.mdp");
            }).find("the box (1.86206 x 1.86206 x 1.86206 nm) is smaller than twice the cut-off (2 x 1 nm)"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(Mdrun, StopsOnOverlappingAtomsNamingThem) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  fs::path dir = scratch("overlap");
  GroFrame f = read_gro(kSpc216);
  // Water 2's oxygen onto water 1's, then a near miss: both refused before any NaN.
  GroFrame exact = f;
  Vec3 shift = f.positions[0] - f.positions[3];
  for (int a = 3; a < 6; ++a) exact.positions[a] = exact.positions[a] + shift;
  write_gro(dir / "exact.gro", exact);
  auto setup = prepare_mdrun(dir / "exact.gro", kData / "topol.top", kData / "step0.mdp");
  EXPECT_NE(error_of([&] { run_mdrun(setup, dir / "out", nullptr); }).find("atoms 1 (OW) and 4 (OW) overlap"),
            std::string::npos);
  GroFrame near = f;
  shift = shift + Vec3{0.03, 0, 0};
  for (int a = 3; a < 6; ++a) near.positions[a] = near.positions[a] + shift;
  write_gro(dir / "near.gro", near);
  setup = prepare_mdrun(dir / "near.gro", kData / "topol.top", kData / "step0.mdp");
  std::string message = error_of([&] { run_mdrun(setup, dir / "out", nullptr); });
  EXPECT_NE(message.find("step 0: the force on atom"), std::string::npos) << message;
  EXPECT_NE(message.find("Atoms overlap"), std::string::npos) << message;
  fs::remove_all(dir);
}

TEST(Mdrun, RefusesMismatchedAtomCounts) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  fs::path dir = scratch("count");
  std::ofstream(dir / "topol.top") << "#include \"oplsaa.ff/forcefield.itp\"\n#include \"oplsaa.ff/spc.itp\"\n"
                                      "[ system ]\nx\n[ molecules ]\nSOL 215\n";
  EXPECT_NE(error_of([&] {
              prepare_mdrun(kSpc216, dir / "topol.top", kData / "step0.mdp");
            }).find("has 648 atoms but the topology " + (dir / "topol.top").string() + " has 645"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace md_run_test
}  // namespace kiln::md
