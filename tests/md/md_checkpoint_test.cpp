// Checkpoints: a run resumed from the checkpoint written at step 20 of a 40-step run continues bit
// for bit as the uninterrupted run (1-propanol with LINCS, v-rescale and c-rescale: generators,
// thermostat work, box and pair list all carried), the checkpoint at the last step extends a run,
// and bad checkpoint files are refused by name.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "error_text.h"
#include "kiln/hpc/md/checkpoint.h"
#include "kiln/hpc/md/engine.h"
#include "small_molecules.h"

namespace kiln::md {
namespace md_checkpoint_test {

namespace fs = std::filesystem;
const fs::path kData = fs::path(KILN_SOURCE_DIR) / "tests/md/data";

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

using md_test::error_of;

TEST(Checkpoint, ResumedRunIsBitIdentical) {
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = md_test::molecule_in_a_box(md_test::kPropanol, kData / "checkpoint.mdp");
  ASSERT_EQ(s.settings.mdp.nsteps, 40);
  const fs::path file = fs::temp_directory_path() / fmt::format("kiln_md_checkpoint_{}.cpt", ::getpid());
  std::vector<std::int64_t> written;
  s.settings.checkpoint_steps = 20;
  s.settings.on_checkpoint = [&](const EngineCheckpoint& c) {
    if (c.next_step == 20) write_checkpoint(file, c);
    written.push_back(c.next_step);
  };
  std::vector<StepEnergies> whole, resumed;
  auto a = make_cpu_engine(s.system, s.settings, s.initial);
  a->run([&](const StepEnergies& e) { whole.push_back(e); });
  // Every 20 steps, the last step included.
  ASSERT_EQ(written, (std::vector<std::int64_t>{20, 40}));
  MdrunSetup r = s;
  r.settings.checkpoint_steps = 0;
  r.settings.resume = std::make_shared<EngineCheckpoint>(read_checkpoint(file, s.system.atom_count));
  EXPECT_EQ(r.settings.resume->next_step, 20);
  auto b = make_cpu_engine(r.system, r.settings, r.initial);
  b->run([&](const StepEnergies& e) { resumed.push_back(e); });
  fs::remove(file);
  ASSERT_EQ(resumed.front().step, 20);
  ASSERT_EQ(whole.size(), 5u);
  ASSERT_EQ(resumed.size(), 3u);
  for (std::size_t k = 0; k < resumed.size(); ++k) {
    const StepEnergies &x = whole[k + 2], &y = resumed[k];
    EXPECT_EQ(x.step, y.step);
    EXPECT_TRUE(same_bits(x.potential, y.potential)) << x.step;
    EXPECT_TRUE(same_bits(x.kinetic, y.kinetic)) << x.step;
    EXPECT_TRUE(same_bits(x.conserved, y.conserved)) << x.step;
    EXPECT_TRUE(same_bits(x.pressure, y.pressure)) << x.step;
    EXPECT_TRUE(same_bits(x.box[0], y.box[0])) << x.step;
  }
  const MdState sa = a->state(), sb = b->state();
  for (std::size_t i = 0; i < sa.positions.size(); ++i)
    for (int d = 0; d < 3; ++d) {
      EXPECT_TRUE(same_bits(sa.positions[i][d], sb.positions[i][d])) << i;
      EXPECT_TRUE(same_bits(sa.velocities[i][d], sb.velocities[i][d])) << i;
    }
  // The box moved under c-rescale before and after the checkpoint.
  EXPECT_NE(sa.box[0], s.initial.box[0]);
}

// The checkpoint at a run's last step holds its final state: a longer run continued from it (as
// gmx mdrun -cpi with a larger -nsteps) is bit for bit the longer run made at once.
TEST(Checkpoint, LastStepCheckpointExtendsTheRun) {
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = md_test::molecule_in_a_box(md_test::kPropanol, kData / "checkpoint.mdp");
  std::vector<StepEnergies> whole, extended;
  auto a = make_cpu_engine(s.system, s.settings, s.initial);
  a->run([&](const StepEnergies& e) { whole.push_back(e); });

  MdrunSetup shorter = s;
  shorter.settings.mdp.nsteps = 25;  // not a multiple of checkpoint_steps
  shorter.settings.checkpoint_steps = 10;
  std::shared_ptr<EngineCheckpoint> last;
  shorter.settings.on_checkpoint = [&](const EngineCheckpoint& c) { last = std::make_shared<EngineCheckpoint>(c); };
  auto b = make_cpu_engine(shorter.system, shorter.settings, shorter.initial);
  b->run([](const StepEnergies&) {});
  ASSERT_TRUE(last);
  ASSERT_EQ(last->next_step, 25);
  const MdState end_of_short = b->state();
  for (std::size_t i = 0; i < end_of_short.positions.size(); ++i)
    for (int d = 0; d < 3; ++d) ASSERT_TRUE(same_bits(end_of_short.positions[i][d], last->positions[i][d])) << i;

  MdrunSetup longer = s;
  longer.settings.resume = last;
  auto c = make_cpu_engine(longer.system, longer.settings, longer.initial);
  c->run([&](const StepEnergies& e) { extended.push_back(e); });
  ASSERT_EQ(extended.size(), 2u);  // the energy steps 30 and 40
  for (std::size_t k = 0; k < 2; ++k) {
    const StepEnergies &x = whole[k + 3], &y = extended[k];
    ASSERT_EQ(x.step, y.step);
    EXPECT_TRUE(same_bits(x.potential, y.potential)) << x.step;
    EXPECT_TRUE(same_bits(x.conserved, y.conserved)) << x.step;
  }
  const MdState sa = a->state(), sc = c->state();
  for (std::size_t i = 0; i < sa.positions.size(); ++i)
    for (int d = 0; d < 3; ++d) EXPECT_TRUE(same_bits(sa.positions[i][d], sc.positions[i][d])) << i;
}

TEST(Checkpoint, BadFilesAreRefusedByName) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln_md_checkpoint_bad_{}", ::getpid());
  fs::create_directories(dir);
  std::ofstream(dir / "other.cpt") << "GROMACS checkpoint";
  EXPECT_NE(error_of([&] { read_checkpoint(dir / "other.cpt", 3); }).find("not a kiln mdrun checkpoint"),
            std::string::npos);
  EngineCheckpoint c;
  c.next_step = 7;
  c.positions = c.velocities = c.list_positions = std::vector<Vec3>(2, Vec3{0.1, 0.2, 0.3});
  c.box = {3, 3, 3};
  c.generators = "1 2";
  write_checkpoint(dir / "two.cpt", c);
  EXPECT_EQ(read_checkpoint(dir / "two.cpt", 2).next_step, 7);
  EXPECT_NE(error_of([&] { read_checkpoint(dir / "two.cpt", 3); }).find("has 2 positions but the system has 3 atoms"),
            std::string::npos);
  fs::resize_file(dir / "two.cpt", 40);
  EXPECT_NE(error_of([&] { read_checkpoint(dir / "two.cpt", 2); }).find("truncated checkpoint"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace md_checkpoint_test
}  // namespace kiln::md
