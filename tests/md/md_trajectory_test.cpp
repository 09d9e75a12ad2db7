// Trajectory files: kiln's .xtc is byte for byte what gmx trjconv writes for the same coordinates,
// gmx reads kiln's .xtc and .trr back to the coordinates (within the precision), kiln's reader
// round-trips every branch of the compression (plain frames of <= 9 atoms, runs of close atoms,
// coordinate ranges too wide to pack together), malformed files are refused by name and offset,
// and kiln mdrun's files survive a crash: resuming from a checkpoint cuts them back and rewrites
// the same bytes. The gmx comparisons are skipped where gmx (Debian's gromacs) is not installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>

#include "error_text.h"
#include "kiln/hpc/md/checkpoint.h"
#include "kiln/hpc/md/gro_file.h"
#include "kiln/hpc/md/mdrun.h"
#include "kiln/hpc/md/trajectory_files.h"
#include "kiln/hpc/md/trajectory_output.h"
#include "small_molecules.h"

namespace kiln::md {
namespace md_trajectory_test {

namespace fs = std::filesystem;
const fs::path kData = fs::path(KILN_SOURCE_DIR) / "tests/md/data";
const fs::path kWater = "/usr/share/gromacs/top/spc216.gro";

bool have_gmx() { return std::system("command -v gmx > /dev/null 2>&1") == 0; }

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using md_test::error_of;

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / fmt::format("kiln_md_{}_{}", name, ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Every coordinate within half a precision step (plus float rounding) of the original.
void expect_within_precision(const std::vector<FloatVec3>& got, const std::vector<Vec3>& want, float precision) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    for (int d = 0; d < 3; ++d)
      ASSERT_NEAR(got[i][d], want[i][d], 0.5 / precision + 1e-6 * (1 + std::fabs(want[i][d]))) << i << " " << d;
}

TEST(Xtc, SameBytesAsGmxTrjconv) {
  if (!have_gmx() || !fs::exists(kWater)) GTEST_SKIP() << "gmx (Debian's gromacs package) is not installed";
  const fs::path dir = scratch("xtc_trjconv");
  ASSERT_EQ(std::system(fmt::format("cd {} && GMX_MAXBACKUP=-1 gmx trjconv -f {} -o gmx.xtc < /dev/null > trjconv.log "
                                    "2>&1",
                                    dir.string(), kWater.string())
                            .c_str()),
            0)
      << slurp(dir / "trjconv.log");
  const GroFrame water = read_gro(kWater);
  EXPECT_EQ(encode_xtc_frame(0, 0, water.box, water.positions, 1000), slurp(dir / "gmx.xtc"));
  fs::remove_all(dir);
}

// gmx dump's coordinates of every frame, in file order.
std::vector<std::vector<Vec3>> gmx_dump_positions(const fs::path& file, const fs::path& dir) {
  const fs::path out = dir / "dump.txt";
  EXPECT_EQ(std::system(fmt::format("gmx dump -f {} > {} 2> /dev/null", file.string(), out.string()).c_str()), 0);
  std::vector<std::vector<Vec3>> frames;
  std::istringstream in(slurp(out));
  const std::regex header(R"(^\S+ frame \d+:)");
  const std::regex position(R"(^\s+x\[\s*\d+\]=\{\s*(\S+),\s*(\S+),\s*(\S+)\})");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, header)) frames.emplace_back();
    if (std::regex_search(line, m, position))
      frames.back().push_back({std::stod(m[1]), std::stod(m[2]), std::stod(m[3])});
  }
  return frames;
}

TEST(Xtc, GmxReadsKilnsFiles) {
  if (!have_gmx() || !fs::exists(kWater)) GTEST_SKIP() << "gmx (Debian's gromacs package) is not installed";
  const fs::path dir = scratch("xtc_gmx_dump");
  GroFrame water = read_gro(kWater);
  std::vector<Vec3> moved = water.positions;
  for (auto& p : moved) p = p + Vec3{0.01234, -0.00567, 0.3};
  std::ofstream(dir / "kiln.xtc", std::ios::binary)
      << encode_xtc_frame(0, 0, water.box, water.positions, 1000) << encode_xtc_frame(10, 0.02, water.box, moved, 100);
  std::ofstream(dir / "kiln.trr", std::ios::binary)
      << encode_trr_frame(0, 0, water.box, &water.positions, &moved, nullptr)
      << encode_trr_frame(10, 0.02, water.box, nullptr, nullptr, &moved);
  ASSERT_EQ(
      std::system(fmt::format("gmx check -f {}/kiln.xtc > {}/check.log 2>&1", dir.string(), dir.string()).c_str()), 0);
  EXPECT_NE(slurp(dir / "check.log").find("Coords           2"), std::string::npos) << slurp(dir / "check.log");
  const auto frames = gmx_dump_positions(dir / "kiln.xtc", dir);
  ASSERT_EQ(frames.size(), 2u);
  const std::vector<std::pair<const std::vector<Vec3>*, double>> expected = {{&water.positions, 1000}, {&moved, 100}};
  for (std::size_t k = 0; k < 2; ++k) {
    ASSERT_EQ(frames[k].size(), expected[k].first->size());
    for (std::size_t i = 0; i < frames[k].size(); ++i)
      for (int d = 0; d < 3; ++d)  // gmx dump prints 6 digits
        ASSERT_NEAR(frames[k][i][d], (*expected[k].first)[i][d], 0.5 / expected[k].second + 1e-5) << k << " " << i;
  }
  ASSERT_EQ(
      std::system(fmt::format("gmx check -f {}/kiln.trr > {}/check.log 2>&1", dir.string(), dir.string()).c_str()), 0);
  const std::string check = slurp(dir / "check.log");
  EXPECT_NE(check.find("Coords           1"), std::string::npos) << check;
  EXPECT_NE(check.find("Velocities       1"), std::string::npos) << check;
  EXPECT_NE(check.find("Forces           1"), std::string::npos) << check;
  const auto trr_frames = gmx_dump_positions(dir / "kiln.trr", dir);
  ASSERT_EQ(trr_frames.size(), 2u);
  ASSERT_EQ(trr_frames[0].size(), water.positions.size());
  for (std::size_t i = 0; i < water.positions.size(); ++i)
    for (int d = 0; d < 3; ++d) ASSERT_NEAR(trr_frames[0][i][d], water.positions[i][d], 1e-5 * 2);
  fs::remove_all(dir);
}

// Water-like clusters (runs of small differences), scattered atoms (the small size shrinking and
// growing), a few atoms (plain floats) and a span too wide to pack (three separate fields).
TEST(Xtc, ReaderRoundTripsEveryBranch) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> box(0, 5), near(-0.1, 0.1);
  std::vector<Vec3> mixed;
  for (int m = 0; m < 300; ++m) {
    const Vec3 o = {box(rng), box(rng), box(rng)};
    mixed.push_back(o);
    if (m % 3 != 2)
      for (int h = 0; h < 1 + m % 4; ++h) mixed.push_back(o + Vec3{near(rng), near(rng), near(rng)});
  }
  std::vector<Vec3> few(mixed.begin(), mixed.begin() + 7);
  std::vector<Vec3> wide = std::vector<Vec3>(mixed.begin(), mixed.begin() + 40);
  const Vec3 b = {5, 5, 5};
  for (float precision : {1000.0f, 100.0f, 1e5f}) {
    wide[3] = {-3e7 / precision, 1.2e7 / precision, 0.5};  // a span of 3e7 units: more than 24 bits
    const std::string bytes = encode_xtc_frame(3, 0.5, b, mixed, precision) +
                              encode_xtc_frame(4, 1, b, few, precision) + encode_xtc_frame(5, 1.5, b, wide, precision);
    const auto frames = parse_xtc(bytes, "mixed.xtc");
    ASSERT_EQ(frames.size(), 3u);
    EXPECT_EQ(frames[0].step, 3);
    EXPECT_FLOAT_EQ(frames[2].time, 1.5);
    EXPECT_FLOAT_EQ(frames[0].box[4], 5.0f);
    EXPECT_EQ(frames[0].precision, precision);
    EXPECT_EQ(frames[2].end_offset, bytes.size());
    expect_within_precision(frames[0].x, mixed, precision);
    expect_within_precision(frames[2].x, wide, precision);
    // Up to 9 atoms are stored as floats, exactly.
    ASSERT_EQ(frames[1].x.size(), few.size());
    for (std::size_t i = 0; i < few.size(); ++i) EXPECT_EQ(frames[1].x[i][0], static_cast<float>(few[i][0]));
  }
  // The compression is real: water at 0.001 nm takes less than half the floats' bytes.
  if (fs::exists(kWater)) {
    const GroFrame water = read_gro(kWater);
    EXPECT_LT(encode_xtc_frame(0, 0, water.box, water.positions, 1000).size(), 12 * water.positions.size() / 2);
  }
}

TEST(Trr, ReaderRoundTrips) {
  const std::vector<Vec3> x = {{1, 2, 3}, {0.5, -0.25, 7}}, v = {{0.1, 0.2, 0.3}, {-1, 0, 1}};
  const std::string bytes = encode_trr_frame(7, 0.014, {3, 4, 5}, &x, &v, nullptr) +
                            encode_trr_frame(8, 0.016, {3, 4, 5}, nullptr, nullptr, &v);
  const auto frames = parse_trr(bytes, "t.trr");
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].step, 7);
  EXPECT_EQ(frames[0].box[8], 5.0f);
  EXPECT_EQ(frames[0].x[1][2], 7.0f);
  EXPECT_EQ(frames[0].v[1][0], -1.0f);
  EXPECT_TRUE(frames[0].f.empty());
  EXPECT_TRUE(frames[1].x.empty());
  EXPECT_EQ(frames[1].f[0][2], 0.3f);
}

TEST(Xtc, MalformedFilesAreRefusedByNameAndOffset) {
  const std::vector<Vec3> x(20, Vec3{1, 1, 1});
  const std::string frame = encode_xtc_frame(0, 0, {2, 2, 2}, x, 1000);
  EXPECT_NE(error_of([&] { parse_xtc(frame.substr(0, frame.size() - 3), "cut.xtc"); }).find("cut.xtc: "),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              parse_xtc(std::string("\x00\x00\x07\xca", 4) + frame.substr(4), "other.xtc");
            }).find("other.xtc: byte 0 starts no xtc frame (magic 1994, expected 1995)"),
            std::string::npos);
  std::string bad_atoms = frame;
  bad_atoms[7] = 21;  // the header says 21 atoms, the coordinates 20
  EXPECT_NE(error_of([&] { parse_xtc(bad_atoms, "atoms.xtc"); }).find("are for 20 atoms, the frame has 21"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              encode_xtc_frame(0, 0, {2, 2, 2}, std::vector<Vec3>(10, Vec3{3e6, 0, 0}), 1000);
            }).find("xtc: atom 1 coordinate 3000000 nm is too large to store at precision 1000"),
            std::string::npos);
  // Resuming keeps whole frames only.
  const std::string two = frame + encode_xtc_frame(5, 0, {2, 2, 2}, x, 1000);
  EXPECT_EQ(xtc_bytes_before_step(two, 5), frame.size());
  EXPECT_EQ(xtc_bytes_before_step(two.substr(0, two.size() - 1), 100), frame.size());
  EXPECT_EQ(xtc_bytes_before_step(two, 0), 0u);
}

// kiln mdrun's files: frames at the .mdp's intervals, the last one the final coordinates; a crash
// after the checkpoint at step 20 (frames beyond it written, the last one cut) followed by --cpi
// leaves byte for byte the files of the uninterrupted run, which is bit for bit the same run.
TEST(MdrunTrajectory, FramesAndResumeAfterACrash) {
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  MdrunSetup s = md_test::molecule_in_a_box(md_test::kPropanol, kData / "checkpoint.mdp");
  s.settings.mdp.nstxout_compressed = 10;
  s.settings.mdp.nstxout = 20;
  s.settings.mdp.nstvout = 20;
  s.settings.mdp.nstfout = 40;
  const fs::path dir = scratch("trajectory");
  s.settings.checkpoint_steps = 20;
  s.settings.on_checkpoint = [&](const EngineCheckpoint& c) {
    if (c.next_step == 20) write_checkpoint(dir / "step20.cpt", c);
  };
  const MdrunResult whole = run_mdrun(s, dir / "whole", nullptr);
  ASSERT_EQ(whole.trajectories.size(), 2u);
  const auto xtc = read_xtc((dir / "whole/traj.xtc").string());
  ASSERT_EQ(xtc.size(), 5u);
  for (std::size_t k = 0; k < xtc.size(); ++k) EXPECT_EQ(xtc[k].step, static_cast<std::int64_t>(10 * k));
  EXPECT_NEAR(xtc[4].time, 40 * s.settings.mdp.dt, 1e-6);
  const GroFrame final_frame = read_gro(dir / "whole/confout.gro");
  expect_within_precision(xtc[4].x, final_frame.positions, 1000);
  const auto trr = read_trr((dir / "whole/traj.trr").string());
  ASSERT_EQ(trr.size(), 3u);
  EXPECT_EQ(trr[1].step, 20);
  EXPECT_FALSE(trr[1].v.empty());
  EXPECT_TRUE(trr[1].f.empty());
  EXPECT_FALSE(trr[2].f.empty());
  for (std::size_t i = 0; i < final_frame.positions.size(); ++i)
    EXPECT_NEAR(trr[2].x[i][0], final_frame.positions[i][0], 5e-4);  // confout.gro has 3 decimals

  // The crashed run: its files hold frames past step 20 and a cut last frame.
  const std::string whole_xtc = slurp(dir / "whole/traj.xtc"), whole_trr = slurp(dir / "whole/traj.trr");
  fs::create_directories(dir / "resumed");
  std::ofstream(dir / "resumed/traj.xtc", std::ios::binary) << whole_xtc.substr(0, xtc[3].end_offset - 10);
  std::ofstream(dir / "resumed/traj.trr", std::ios::binary) << whole_trr.substr(0, trr[2].end_offset - 100);
  MdrunSetup r = s;
  r.settings.checkpoint_steps = 0;
  r.settings.resume = std::make_shared<EngineCheckpoint>(read_checkpoint(dir / "step20.cpt", s.system.atom_count));
  run_mdrun(r, dir / "resumed", nullptr);
  EXPECT_TRUE(slurp(dir / "resumed/traj.xtc") == whole_xtc);
  EXPECT_TRUE(slurp(dir / "resumed/traj.trr") == whole_trr);
  fs::remove_all(dir);
}

TEST(MdrunTrajectory, OptionsAreParsedAndCheckedByName) {
  const MdpOptions o = parse_mdp(
      "nstxout-compressed = 50\ncompressed-x-precision = 100\ncompressed-x-grps = System\nnstxout = 0\nnstvout = 10\n",
      "t.mdp");
  EXPECT_EQ(o.nstxout_compressed, 50);
  EXPECT_EQ(o.compressed_x_precision, 100.0f);
  EXPECT_EQ(o.nstvout, 10);
  EXPECT_NE(error_of([] {
              parse_mdp("compressed-x-grps = Protein\n", "g.mdp");
            }).find("g.mdp:1: option 'compressed-x-grps' = 'Protein': only System"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_mdp("nstxout = -5\n", "n.mdp");
            }).find("n.mdp:1: option 'nstxout' = -5 must be 0 (no output) or a positive step interval"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mdp("compressed-x-precision = 0\n", "p.mdp"); }).find("must be positive"),
            std::string::npos);
}

}  // namespace md_trajectory_test
}  // namespace kiln::md
