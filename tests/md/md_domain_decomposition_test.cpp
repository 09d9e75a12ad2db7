// Domain decomposition of the CPU engine (domain_decomposition.h). Under mpirun -np 2 and 4
// (CTest md_dd_mpirun_2/4) the decomposed run is compared on every rank with the one-rank run of
// the same input, made by the same process: the step-0 terms to 1e-10 relative, then 40 steps
// whose trajectory must follow the one-rank run while atoms move between ranks. Run alone (a world
// of one) those tests skip; the grid choice and the update groups are checked alone too.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "error_text.h"
#include "kiln/dist/communicator.h"
#include "kiln/hpc/md/checkpoint.h"
#include "kiln/hpc/md/domain_decomposition.h"
#include "kiln/hpc/md/engine.h"
#include "kiln/hpc/md/mdrun.h"
#include "small_molecules.h"

namespace kiln::md {
namespace md_domain_decomposition_test {

namespace fs = std::filesystem;
const fs::path kData = fs::path(KILN_SOURCE_DIR) / "tests/md/data";
#if defined(__SANITIZE_ADDRESS__)
constexpr int kSteps = 20;  // the sanitizer build (tools/test-sanitize.sh, CI) is many times slower
#else
constexpr int kSteps = 40;
#endif

using md_test::error_of;

// Errors end with the place that raised them.
bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

struct Run {
  std::vector<StepEnergies> energies;
  MdState state;
  EngineCounters counters;
};

Run run(const MdrunSetup& s) {
  Run r;
  auto engine = make_cpu_engine(s.system, s.settings, s.initial);
  engine->run([&](const StepEnergies& e) { r.energies.push_back(e); });
  r.state = engine->state();
  r.counters = engine->counters();
  return r;
}

double relative(double a, double b) { return std::abs(a - b) / std::max(1.0, std::max(std::abs(a), std::abs(b))); }

// The decomposed run against one rank: every energy term of every frame, the final state.
void expect_one_rank_results(MdrunSetup s, double step0_tolerance, double trajectory_tolerance,
                             std::int64_t* migrated = nullptr) {
  s.settings.threads = 1;
  const Run one = run(s);
  const dist::Communicator world = dist::Communicator::world();
  use_domain_decomposition(s, world, {0, 0, 0});
  ASSERT_TRUE(s.settings.dd_comm);
  const Run many = run(s);
  if (world.rank() != 0) {
    EXPECT_TRUE(many.energies.empty()) << "only rank 0 reports energies";
    return;
  }
  ASSERT_EQ(one.energies.size(), many.energies.size());
  for (std::size_t f = 0; f < one.energies.size(); ++f) {
    const auto a = named_terms(one.energies[f], s.system), b = named_terms(many.energies[f], s.system);
    ASSERT_EQ(a.size(), b.size());
    const double tolerance = f == 0 ? step0_tolerance : trajectory_tolerance;
    for (std::size_t k = 0; k < a.size(); ++k) {
      EXPECT_EQ(a[k].first, b[k].first);
      EXPECT_LE(relative(a[k].second, b[k].second), tolerance)
          << "step " << one.energies[f].step << " " << a[k].first << ": one rank " << a[k].second << ", "
          << world.size() << " ranks " << b[k].second;
    }
  }
  ASSERT_EQ(one.state.positions.size(), many.state.positions.size());
  double worst = 0;
  for (std::size_t i = 0; i < one.state.positions.size(); ++i)
    for (int d = 0; d < 3; ++d) {
      worst = std::max(worst, std::abs(one.state.positions[i][d] - many.state.positions[i][d]));
      worst = std::max(worst, std::abs(one.state.velocities[i][d] - many.state.velocities[i][d]) * s.settings.mdp.dt);
    }
  EXPECT_LE(worst, trajectory_tolerance) << "largest position difference (nm) after the run";
  for (int d = 0; d < 3; ++d) EXPECT_LE(relative(one.state.box[d], many.state.box[d]), trajectory_tolerance);
  EXPECT_EQ(one.counters.pair_list_builds, many.counters.pair_list_builds);
  EXPECT_EQ(one.counters.pairs_in_list, many.counters.pairs_in_list);
  if (migrated) *migrated = many.counters.migrated_atoms;
}

bool world_of_one() { return dist::Communicator::world().size() == 1; }

// 216 rigid SPC waters, PME, NVE from gen-vel, 40 steps with a search every 10.
TEST(MdDomainDecomposition, WaterBoxFollowsOneRank) {
  if (world_of_one()) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: md_dd_mpirun_2/4)";
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = prepare_mdrun("/usr/share/gromacs/top/spc216.gro", kData / "topol.top", kData / "nve.mdp");
  s.settings.mdp.nsteps = kSteps;
  s.settings.mdp.nstenergy = 10;
  std::int64_t migrated = 0;
  expect_one_rank_results(s, 1e-10, 1e-9, &migrated);
  if (dist::Communicator::world().rank() == 0) {
    EXPECT_GT(migrated, 0) << "no water changed rank in " << kSteps << " steps";
  }
}

// The slab-decomposed PME (the default, used above) and the replicated one (every rank solves the
// all-reduced grid) in the same decomposed run: every energy term of every frame agrees (1e-10 at
// step 0, 1e-9 after; they differ only in the order of the sums), and the bytes each sent are what
// they must be: the replicated run's an all-reduce of the grid a call.
TEST(MdDomainDecomposition, SlabAndReplicatedPmeAgree) {
  if (world_of_one()) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: md_dd_mpirun_2/4)";
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  const dist::Communicator world = dist::Communicator::world();
  MdrunSetup s = prepare_mdrun("/usr/share/gromacs/top/spc216.gro", kData / "topol.top", kData / "nve.mdp");
  s.settings.mdp.nsteps = kSteps / 2;
  s.settings.mdp.nstenergy = 5;
  s.settings.threads = 1;
  use_domain_decomposition(s, world, {0, 0, 0});
  ASSERT_EQ(s.settings.pme_decomposition, PmeDecomposition::Slab) << "the default";
  const md_domain_decomposition_test::Run slab = run(s);
  s.settings.pme_decomposition = PmeDecomposition::Replicated;
  const md_domain_decomposition_test::Run replicated = run(s);
  if (world.rank() != 0) return;
  ASSERT_EQ(slab.energies.size(), replicated.energies.size());
  ASSERT_GT(slab.energies.size(), 2u);
  for (std::size_t f = 0; f < slab.energies.size(); ++f) {
    const auto a = named_terms(slab.energies[f], s.system), b = named_terms(replicated.energies[f], s.system);
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t k = 0; k < a.size(); ++k)
      EXPECT_LE(relative(a[k].second, b[k].second), f == 0 ? 1e-10 : 1e-9)
          << "step " << slab.energies[f].step << " " << a[k].first << ": slab " << a[k].second << ", replicated "
          << b[k].second;
  }
  const auto& g = s.settings.pme_grid;
  const std::int64_t grid_bytes = static_cast<std::int64_t>(g[0]) * g[1] * g[2] * 8;
  EXPECT_EQ(replicated.counters.pme_calls, slab.counters.pme_calls);
  // A bandwidth-optimal all-reduce sends 2 (ranks - 1) / ranks of the grid from each rank.
  EXPECT_EQ(replicated.counters.pme_bytes_sent,
            replicated.counters.pme_calls * (2 * (world.size() - 1) * grid_bytes / world.size()) * world.size());
  // (In this 16-plane grid the slabs' halo planes and transposes come to about the all-reduce's
  // bytes; docs/mdrun.md has the 23,328-atom replica's figures, where the slabs move fewer.)
  EXPECT_GT(slab.counters.pme_bytes_sent, 0);
}

// Reaction-field instead of PME.
TEST(MdDomainDecomposition, ReactionFieldStepZero) {
  if (world_of_one()) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: md_dd_mpirun_2/4)";
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s =
      prepare_mdrun("/usr/share/gromacs/top/spc216.gro", kData / "topol.top", kData / "step0_reaction_field.mdp");
  s.settings.mdp.nsteps = 0;
  expect_one_rank_results(s, 1e-10, 1e-10);
}

// A lone 1-propanol in a 3 nm box: one update group, so one rank holds every atom and the others
// none; bonded terms, 1-4 pairs, LINCS (h-bonds), v-rescale and c-rescale (the same random numbers
// on every rank); 40 steps.
TEST(MdDomainDecomposition, LoneMoleculeWithLincsAndCouplingFollowsOneRank) {
  if (world_of_one()) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: md_dd_mpirun_2/4)";
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = md_test::molecule_in_a_box(md_test::kPropanol, kData / "checkpoint.mdp");
  s.settings.mdp.nsteps = kSteps;
  expect_one_rank_results(s, 1e-10, 1e-9);
}

// The villin headpiece in water (8369 atoms, committed: data/villin) with checkpoint.mdp's settings:
// h-bond constraints (LINCS) on the protein, v-rescale and c-rescale every 5 steps (the box scaled at
// step 0, so the ranks repartition at step 1), 5 steps. The protein is one update group (its radius
// widens every rank's halo); its bonded terms, 1-4 pairs and exclusions stay on its rank.
TEST(MdDomainDecomposition, ProteinInWaterWithLincsAndCouplingFollowsOneRank) {
  if (world_of_one()) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: md_dd_mpirun_2/4)";
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = prepare_mdrun(kData / "villin/conf.gro", kData / "villin/topol.top", kData / "checkpoint.mdp");
  ASSERT_FALSE(s.system.constraints.empty());
  s.settings.mdp.nsteps = kSteps / 8;  // 5 steps; 2 in the sanitizer build
  expect_one_rank_results(s, 1e-10, 1e-9);
}

// A decomposed run resumed from its own checkpoint (written by rank 0 in the global atom order,
// read by every rank) continues bit for bit as the uninterrupted decomposed run: the ranks take
// the domains of the last search step, from the list's positions. The water box with LINCS'
// settings, v-rescale and c-rescale (checkpoint.mdp): waters change rank on the way. The same file
// also continues on one rank, as the one-rank run would (to the decomposition's rounding).
TEST(MdDomainDecomposition, ResumesFromItsCheckpoint) {
  if (world_of_one()) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: md_dd_mpirun_2/4)";
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  const dist::Communicator world = dist::Communicator::world();
  MdrunSetup s = prepare_mdrun("/usr/share/gromacs/top/spc216.gro", kData / "topol.top", kData / "checkpoint.mdp");
  s.settings.mdp.nsteps = kSteps;
  s.settings.threads = 1;
  const std::int64_t at = kSteps / 2 + 3;  // not a search step: the list was built 3 steps before
  const fs::path file = fs::temp_directory_path() / fmt::format("kiln_md_dd_checkpoint_{}.cpt", world.size());
  MdrunSetup one = s;
  use_domain_decomposition(s, world, {0, 0, 0});
  s.settings.checkpoint_steps = at;
  s.settings.on_checkpoint = [&](const EngineCheckpoint& c) {
    if (c.next_step == at) write_checkpoint(file, c);
  };
  const md_domain_decomposition_test::Run whole = run(s);
  world.barrier();
  MdrunSetup r = s;
  r.settings.checkpoint_steps = 0;
  r.settings.on_checkpoint = nullptr;
  r.settings.resume = std::make_shared<EngineCheckpoint>(read_checkpoint(file, s.system.atom_count));
  const md_domain_decomposition_test::Run resumed = run(r);
  one.settings.resume = r.settings.resume;
  const md_domain_decomposition_test::Run on_one_rank = run(one);
  world.barrier();
  if (world.rank() != 0) return;
  fs::remove(file);
  ASSERT_FALSE(resumed.energies.empty());
  std::size_t k0 = 0;
  while (k0 < whole.energies.size() && whole.energies[k0].step < resumed.energies.front().step) ++k0;
  ASSERT_EQ(whole.energies.size() - k0, resumed.energies.size());
  ASSERT_EQ(on_one_rank.energies.size(), resumed.energies.size());
  for (std::size_t k = 0; k < resumed.energies.size(); ++k) {
    const auto a = named_terms(whole.energies[k0 + k], s.system), b = named_terms(resumed.energies[k], s.system),
               c = named_terms(on_one_rank.energies[k], s.system);
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t t = 0; t < a.size(); ++t) {
      EXPECT_EQ(a[t].second, b[t].second) << "step " << resumed.energies[k].step << " " << a[t].first;
      EXPECT_LE(relative(a[t].second, c[t].second), 1e-9) << "one rank, step " << resumed.energies[k].step;
    }
  }
  for (std::size_t i = 0; i < whole.state.positions.size(); ++i)
    for (int d = 0; d < 3; ++d) {
      EXPECT_EQ(whole.state.positions[i][d], resumed.state.positions[i][d]) << "atom " << i;
      EXPECT_EQ(whole.state.velocities[i][d], resumed.state.velocities[i][d]) << "atom " << i;
    }
  EXPECT_GT(whole.counters.migrated_atoms, 0);
}

TEST(MdDomainDecomposition, DomainThinnerThanTheListRadiusIsRefused) {
  const Vec3 box{1.86206, 1.86206, 1.86206};
  EXPECT_EQ(choose_domain_grid(4, box, 0.931, 0.9, {0, 0, 0}), (std::array<int, 3>{2, 2, 1}));
  EXPECT_EQ(choose_domain_grid(2, {4, 2, 2}, 1.0, 0.9, {0, 0, 0}), (std::array<int, 3>{2, 1, 1}));
  EXPECT_EQ(choose_domain_grid(2, {2, 2, 4}, 1.0, 0.9, {0, 0, 0}), (std::array<int, 3>{1, 1, 2}));
  const std::string thin = error_of([&] { choose_domain_grid(4, box, 0.931, 0.9, {4, 1, 1}); });
  EXPECT_TRUE(starts_with(thin,
                          "mdrun: domain decomposition 4 x 1 x 1 over 4 ranks: the domains are 0.4655 nm wide along x "
                          "(box 1.8621 nm), thinner than the cut-off + buffer (rlist 0.9310 nm = rc 0.9000 + 0.0310 "
                          "nm); every domain must be at least rlist wide: use fewer ranks or another --dd"))
      << thin;
  // No grid of 16 domains leaves them 0.931 nm wide in this box.
  const std::string none = error_of([&] { choose_domain_grid(16, box, 0.931, 0.9, {0, 0, 0}); });
  EXPECT_NE(none.find("thinner than the cut-off + buffer"), std::string::npos) << none;
  const std::string count = error_of([&] { choose_domain_grid(2, box, 0.931, 0.9, {2, 2, 1}); });
  EXPECT_TRUE(starts_with(count, "mdrun: --dd 2 x 2 x 1 has 4 domains but mpirun started 2 ranks")) << count;
}

TEST(MdDomainDecomposition, UpdateGroupsAreMolecules) {
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = md_test::molecule_in_a_box(md_test::kPropanol, kData / "checkpoint.mdp");
  const auto groups = update_groups(s.system);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0], (std::array<int, 2>{0, 12}));
  // The villin box: the protein, then one group per water and per ion.
  MdrunSetup v = prepare_mdrun(kData / "villin/conf.gro", kData / "villin/topol.top", kData / "nve.mdp");
  const auto in_water = update_groups(v.system);
  int waters = 0, ions = 0;
  for (std::size_t g = 1; g < in_water.size(); ++g) {
    const int n = in_water[g][1] - in_water[g][0];
    waters += n == 3;
    ions += n == 1;
    EXPECT_TRUE(n == 3 || n == 1) << g;
  }
  EXPECT_GT(in_water[0][1] - in_water[0][0], 500);  // the protein, all atoms before the first water
  EXPECT_EQ(in_water[0][1] + 3 * waters + ions, v.system.atom_count);
}

}  // namespace md_domain_decomposition_test
}  // namespace kiln::md
