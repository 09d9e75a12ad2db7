// GROMACS's Verlet-buffer estimate (verlet_buffer.h) against the numbers GROMACS 2022.5 itself
// prints. References: `gmx grompp` (Debian 12's 2022.5) on spc216.gro replicated 3x3x4 by `gmx
// genconf -nbox 3 3 4` (23,328 atoms, 5.58618 x 5.58618 x 7.44824 nm), OPLS-AA SPC, dt 2 fs, PME
// 0.12 nm order 4 at ewald-rtol 1e-5, rc = rvdw = 1.0 nm, constraints = h-bonds (SETTLE),
// v-rescale at 300 K, verlet-buffer-tolerance 0.005 unless named; grompp prints "Calculated rlist
// for 1x1 atom pair-list as R1" and "Set rlist, assuming 4x4 atom pair-list, to R4" for the .mdp's
// nstlist (lifetime nstlist - 1). The nstlist choice is gmx mdrun's on the CPU (docs/mdrun.md:
// "Changing nstlist from 10 to 40, rlist from 1 to 1.096" on this box).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gromacs_data.h"
#include "kiln/hpc/md/ewald_parameters.h"
#include "kiln/hpc/md/topology.h"
#include "kiln/hpc/md/verlet_buffer.h"

namespace kiln::md {
namespace md_verlet_buffer_test {

namespace fs = std::filesystem;

const Vec3 kBox{5.58618, 5.58618, 7.44824};

MdSystem water_23k() {
  fs::path top = fs::temp_directory_path() / fmt::format("kiln_vbuf_{}.top", ::getpid());
  {
    std::ofstream out(top);
    out << "#include \"oplsaa.ff/forcefield.itp\"\n#include \"oplsaa.ff/spc.itp\"\n[ system ]\nw\n"
        << "[ molecules ]\nSOL 7776\n";
  }
  MdSystem s = read_topology(top, {});
  fs::remove(top);
  return s;
}

VerletBufferInput input(double rc = 1.0, double temperature = 300, double tolerance = 0.005, double dt = 0.002) {
  VerletBufferInput in;
  in.cutoff = rc;
  in.beta = ewald_coefficient(rc, 1e-5);
  in.dt = dt;
  in.tolerance = tolerance;
  in.temperature = temperature;
  in.volume = kBox[0] * kBox[1] * kBox[2];
  return in;
}

bool have_data() { return fs::exists(md_test::gromacs_top() / "oplsaa.ff/spc.itp"); }

struct Reference {
  int nstlist;
  double r1x1, r4x4;
};

TEST(VerletBuffer, MatchesGrompp) {
  if (!have_data()) GTEST_SKIP() << "gromacs-data is not installed";
  const MdSystem s = water_23k();
  const VerletBufferInput in = input();
  for (const Reference& r : {Reference{10, 1.035, 1.000}, Reference{20, 1.100, 1.030}, Reference{25, 1.132, 1.048},
                             Reference{40, 1.211, 1.096}, Reference{50, 1.245, 1.116}, Reference{80, 1.288, 1.143},
                             Reference{100, 1.319, 1.166}}) {
    EXPECT_NEAR(verlet_buffer_rlist(s, in, r.nstlist, r.nstlist - 1, 1), r.r1x1, 1e-9) << "nstlist " << r.nstlist;
    EXPECT_NEAR(verlet_buffer_rlist(s, in, r.nstlist, r.nstlist - 1, 4), r.r4x4, 1e-9) << "nstlist " << r.nstlist;
  }
}

// Other settings, each from its own grompp run on the same box.
TEST(VerletBuffer, MatchesGromppForOtherSettings) {
  if (!have_data()) GTEST_SKIP() << "gromacs-data is not installed";
  const MdSystem s = water_23k();
  auto both = [&](const VerletBufferInput& in, int nstlist, double r1, double r4, const char* what) {
    EXPECT_NEAR(verlet_buffer_rlist(s, in, nstlist, nstlist - 1, 1), r1, 1e-9) << what;
    EXPECT_NEAR(verlet_buffer_rlist(s, in, nstlist, nstlist - 1, 4), r4, 1e-9) << what;
  };
  both(input(0.9), 40, 1.116, 1.002, "rc 0.9");
  both(input(1.0, 350), 40, 1.227, 1.107, "350 K");
  both(input(1.0, 300, 0.001), 20, 1.140, 1.078, "tolerance 0.001");
  both(input(1.0, 300, 0.005, 0.001), 20, 1.039, 1.000, "dt 1 fs");
  both(input(), 4, 1.005, 1.000, "nstlist 4");
  both(input(), 8, 1.024, 1.000, "nstlist 8");
  VerletBufferInput rf = input();
  rf.reaction_field = true;
  rf.epsilon_rf = 0;  // GROMACS's default: infinity
  both(rf, 40, 1.425, 1.340, "reaction-field");
}

// gmx mdrun's choices: on the CPU (list factor 1.25) 10 -> 40 at 1.096 nm, as GROMACS 2022 chose on
// this box; on a GPU (1.4) the largest candidate, 100, at grompp's 1.166 nm for it, with rolling
// pruning of an inner list whose buffer first becomes non-zero.
TEST(VerletBuffer, PlansTheListsAsGmxMdrun) {
  if (!have_data()) GTEST_SKIP() << "gromacs-data is not installed";
  const MdSystem s = water_23k();
  const VerletBufferInput in = input();
  PairListPlan cpu = plan_pair_lists(s, in, 10, kBox, false, 0, false);
  EXPECT_EQ(cpu.nstlist, 40);
  EXPECT_NEAR(cpu.rlist, 1.096, 1e-9);
  ASSERT_FALSE(cpu.log.empty());
  EXPECT_EQ(cpu.log[0], "Changing nstlist from 10 to 40, rlist from 1 to 1.096");
  PairListPlan gpu = plan_pair_lists(s, in, 10, kBox, true, 0, true);
  EXPECT_EQ(gpu.nstlist, 100);
  EXPECT_NEAR(gpu.rlist, 1.166, 1e-9);
  EXPECT_EQ(gpu.log[0], "Changing nstlist from 10 to 100, rlist from 1 to 1.166");
  for (const auto& line : gpu.log) fmt::print("{}\n", line);  // what md.log reports, for the docs
  ASSERT_TRUE(gpu.dynamic_pruning);
  EXPECT_EQ(gpu.nstlist_prune % 2, 0);
  EXPECT_GE(gpu.nstlist_prune, 4);
  EXPECT_GT(gpu.rlist_inner, 1.0);
  // The prune interval is the first one (in steps of 2 from 4) that needs a buffer at all.
  EXPECT_EQ(verlet_buffer_rlist(s, in, gpu.nstlist_prune - 2, gpu.nstlist_prune - 2), 1.0);
  EXPECT_EQ(gpu.rolling_parts, gpu.nstlist_prune / 2);
  // gmx mdrun -nstlist 20 without pruning: that nstlist's buffer, one list.
  PairListPlan fixed = plan_pair_lists(s, in, 10, kBox, true, 20, false);
  EXPECT_EQ(fixed.nstlist, 20);
  EXPECT_NEAR(fixed.rlist, 1.030, 1e-9);
  EXPECT_FALSE(fixed.dynamic_pruning);
  EXPECT_EQ(fixed.rlist_inner, fixed.rlist);
}

}  // namespace md_verlet_buffer_test
}  // namespace kiln::md
