// kiln mdrun's input files: .gro fixed columns and their errors (file:line), .mdp options (unknown
// ones named), and .top preprocessing with the sections water needs; unsupported sections refused
// by name.
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
#include "kiln/hpc/md/mdp_options.h"
#include "kiln/hpc/md/topology.h"
#include "kiln/runtime/error.h"

namespace kiln::md {
namespace md_input_test {

namespace fs = std::filesystem;

const fs::path kData = fs::path(KILN_SOURCE_DIR) / "tests/md/data";
const fs::path kSpc216 = kiln::md_test::gromacs_top() / "spc216.gro";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

const char* kTwoAtoms =
    "two atoms\n"
    "    2\n"
    "    1SOL     OW    1   0.230   0.628   0.113  0.1000 -0.2000  0.3000\n"
    "    1SOL    HW1    2   0.137   0.626   0.150  0.0000  0.0000  1.0000\n"
    "   1.86206   1.86206   1.86206\n";

TEST(GroFile, ParsesFixedColumnsWithVelocities) {
  GroFrame f = parse_gro(kTwoAtoms, "two.gro");
  ASSERT_EQ(f.positions.size(), 2u);
  EXPECT_EQ(f.atom_names[1], "HW1");
  EXPECT_EQ(f.residue_names[0], "SOL");
  EXPECT_DOUBLE_EQ(f.positions[0][1], 0.628);
  ASSERT_EQ(f.velocities.size(), 2u);
  EXPECT_DOUBLE_EQ(f.velocities[0][1], -0.2);
  EXPECT_DOUBLE_EQ(f.box[2], 1.86206);
  // Writing and reading back gives the same frame (GROMACS's layout, 3 decimals).
  GroFrame g = parse_gro(format_gro(f), "round.gro");
  EXPECT_EQ(g.positions, f.positions);
  EXPECT_EQ(g.velocities, f.velocities);
  EXPECT_EQ(g.box, f.box);
}

TEST(GroFile, ReadsSpc216FromGromacsData) {
  if (!fs::exists(kSpc216)) GTEST_SKIP() << "gromacs-data is not installed (tools/setup.sh installs it)";
  GroFrame f = read_gro(kSpc216);
  EXPECT_EQ(f.positions.size(), 648u);
  EXPECT_TRUE(f.velocities.empty());
  EXPECT_DOUBLE_EQ(f.box[0], 1.86206);
}

TEST(GroFile, MalformedLinesNameFileAndLine) {
  std::string bad = kTwoAtoms;
  bad.replace(bad.find("0.626"), 5, "0.6x6");
  EXPECT_NE(error_of([&] { parse_gro(bad, "bad.gro"); }).find("bad.gro:4: y '0.6x6' is not a number"),
            std::string::npos);
  std::string shortline =
      "t\n    2\n    1SOL     OW    1   0.230   0.628   0.113\n    1SOL    HW1    2   0.137\n"
      "   1 1 1\n";
  EXPECT_NE(error_of([&] { parse_gro(shortline, "short.gro"); }).find("short.gro:4: atom line has"), std::string::npos);
  EXPECT_NE(error_of([&] { parse_gro("t\n   5\n", "count.gro"); }).find("count.gro: the atom count (line 2) says 5"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_gro("t\n  x2\n", "n.gro"); }).find("n.gro:2: atom count 'x2' is not an integer"),
            std::string::npos);
  // The largest count a long holds: refused by the line count, without overflowing n + 3.
  EXPECT_NE(error_of([&] {
              parse_gro("t\n 9223372036854775807\n 0 20\n", "huge.gro");
            }).find("huge.gro: the atom count (line 2) says 9223372036854775807 atoms"),
            std::string::npos);
  std::string triclinic = "t\n    1\n    1SOL     OW    1   0.230   0.628   0.113\n 1 1 1 0 0 0.5 0 0 0\n";
  EXPECT_NE(error_of([&] { parse_gro(triclinic, "tri.gro"); }).find("tri.gro:4: triclinic boxes are not supported"),
            std::string::npos);
}

TEST(MdpOptions, ParsesSupportedOptions) {
  MdpOptions o = parse_mdp(
      "; comment\nintegrator = md\ndt = 0.002 ; ps\nnsteps=100\ncoulombtype = pme\nrcoulomb = 0.9\nrvdw = 0.9\n"
      "tcoupl = V-rescale\ntc_grps = System\ntau-t = 0.1\nref-t = 310\ngen-vel = yes\ngen-seed = 7\n"
      "define = -DFLEXIBLE -DPOSRES_FC=500\nnstlog = 10\n",
      "run.mdp");
  EXPECT_DOUBLE_EQ(o.dt, 0.002);
  EXPECT_EQ(o.nsteps, 100);
  EXPECT_EQ(o.tcoupl, Thermostat::VRescale);
  EXPECT_DOUBLE_EQ(o.ref_t, 310);
  EXPECT_TRUE(o.gen_vel);
  EXPECT_EQ(o.gen_seed, 7);
  ASSERT_EQ(o.defines.size(), 2u);
  EXPECT_EQ(o.defines[1], "POSRES_FC=500");
}

TEST(MdpOptions, DispCorrTakesGromacsValues) {
  EXPECT_EQ(parse_mdp("dt = 0.002\n", "a.mdp").dispcorr, DispCorr::No);
  EXPECT_EQ(parse_mdp("DispCorr = EnerPres\n", "a.mdp").dispcorr, DispCorr::EnerPres);
  EXPECT_EQ(parse_mdp("dispcorr = ener\n", "a.mdp").dispcorr, DispCorr::Ener);
  EXPECT_EQ(parse_mdp("DispCorr = AllEnerPres\n", "a.mdp").dispcorr, DispCorr::AllEnerPres);
  EXPECT_EQ(parse_mdp("DispCorr = AllEner\n", "a.mdp").dispcorr, DispCorr::AllEner);
  EXPECT_EQ(parse_mdp("DispCorr = no\n", "a.mdp").dispcorr, DispCorr::No);
  EXPECT_NE(error_of([] {
              parse_mdp("dt = 0.002\nDispCorr = yes\n", "b.mdp");
            }).find("b.mdp:2: option 'dispcorr' = 'yes': expected no, EnerPres, Ener, AllEnerPres, AllEner"),
            std::string::npos);
}

TEST(MdpOptions, RefusesUnknownAndUnsupportedOptionsByName) {
  EXPECT_NE(error_of([] {
              parse_mdp("dt = 0.002\nfancy-option = 3\n", "a.mdp");
            }).find("a.mdp:2: unknown or unsupported option 'fancy-option'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_mdp("coulombtype = Ewald\n", "b.mdp");
            }).find("b.mdp:1: option 'coulombtype' = 'Ewald' is not supported by kiln mdrun yet"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mdp("dt = fast\n", "c.mdp"); }).find("c.mdp:1: option 'dt' = 'fast' is not a number"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mdp("nsteps = 1\nnsteps = 2\n", "d.mdp"); })
                .find("d.mdp:2: option 'nsteps' is given "
                      "twice"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mdp("just words\n", "e.mdp"); }).find("e.mdp:1: 'just words' is not 'option = value'"),
            std::string::npos);
}

fs::path write_file(const fs::path& dir, const std::string& name, const std::string& text) {
  fs::create_directories(dir);
  std::ofstream(dir / name) << text;
  return dir / name;
}

const char* kForceField =
    "[ defaults ]\n1 2 yes 0.5 0.5\n"
    "[ atomtypes ]\nOW 15.9994 0.0 A 0.316557 0.650194\nHW 1.008 0.0 A 0 0\n";

TEST(Topology, PreprocessesIncludesAndConditionals) {
  fs::path dir = fs::temp_directory_path() / fmt::format("kiln_md_top_{}", ::getpid());
  write_file(dir / "ff", "forcefield.itp", kForceField);
  write_file(dir, "water.itp",
             "[ moleculetype ]\nSOL 2\n[ atoms ]\n1 OW 1 SOL OW 1 -0.82\n2 HW 1 SOL HW1 1 0.41\n"
             "3 HW 1 SOL HW2 1 CHARGE_H\n"
             "#ifndef FLEXIBLE\n[ settles ]\n1 1 0.1 0.16330\n[ exclusions ]\n1 2 3\n2 1 3\n3 1 2\n"
             "#else\n[ bonds ]\n1 2 1 0.1 345000\n1 3 1 0.1 345000\n[ angles ]\n2 1 3 1 109.47 383\n#endif\n");
  fs::path top = write_file(dir, "topol.top",
                            "#define CHARGE_H 0.41\n#include \"ff/forcefield.itp\"\n#include \"water.itp\"\n"
                            "[ system ]\nwater\n[ molecules ]\nSOL 2\n");
  MdSystem rigid = read_topology(top, {.include_dirs = {}, .defines = {}});
  EXPECT_EQ(rigid.atom_count, 6);
  EXPECT_EQ(rigid.settles.size(), 2u);
  EXPECT_TRUE(rigid.bonds.empty());
  EXPECT_DOUBLE_EQ(rigid.charges[5], 0.41);
  EXPECT_TRUE(rigid.excluded(3, 5));
  EXPECT_FALSE(rigid.excluded(0, 3));
  // Comb-rule 2: c6 = 4 eps sigma^6, c12 = 4 eps sigma^12.
  double s6 = std::pow(0.316557, 6);
  EXPECT_NEAR(rigid.c6[0], 4 * 0.650194 * s6, 1e-15);
  EXPECT_NEAR(rigid.c12[0], 4 * 0.650194 * s6 * s6, 1e-18);
  MdSystem flexible = read_topology(top, {.include_dirs = {}, .defines = {"FLEXIBLE"}});
  EXPECT_EQ(flexible.bonds.size(), 4u);
  EXPECT_EQ(flexible.angles.size(), 2u);
  EXPECT_TRUE(flexible.settles.empty());
  EXPECT_TRUE(flexible.excluded(0, 2));  // nrexcl 2: H1-H2 are two bonds apart
  EXPECT_NEAR(flexible.angles[0].theta0, 109.47 * M_PI / 180, 1e-15);
  fs::remove_all(dir);
}

TEST(Topology, RefusesUnsupportedSectionsAndBadLinesWithLocation) {
  fs::path dir = fs::temp_directory_path() / fmt::format("kiln_md_top_bad_{}", ::getpid());
  write_file(dir, "ff.itp", kForceField);
  fs::path top =
      write_file(dir, "dihedral.top",
                 "#include \"ff.itp\"\n[ moleculetype ]\nM 3\n[ atoms ]\n1 OW 1 M O 1 0\n2 HW 1 M H 1 0\n"
                 "3 HW 1 M H 1 0\n4 HW 1 M H 1 0\n[ dihedrals ]\n1 2 3 4 9\n[ system ]\nx\n[ molecules ]\nM 1\n");
  EXPECT_NE(error_of([&] { read_topology(top, {.include_dirs = {}, .defines = {}}); })
                .find((dir / "dihedral.top").string() +
                      ":10: no [ dihedraltypes ] entry for bond types OW-HW-HW-HW (function 9)"),
            std::string::npos);
  fs::path constraints =
      write_file(dir, "constraints.top",
                 "#include \"ff.itp\"\n[ moleculetype ]\nM 3\n[ atoms ]\n1 OW 1 M O 1 0\n2 HW 1 M H 1 0\n"
                 "[ constraints ]\n1 2 1 0.1\n[ system ]\nx\n[ molecules ]\nM 1\n");
  EXPECT_NE(error_of([&] { read_topology(constraints, {.include_dirs = {}, .defines = {}}); })
                .find("molecule type 'M' uses [ constraints ] at " + constraints.string() +
                      ":7, which kiln mdrun does not support yet"),
            std::string::npos);
  fs::path harmonic_improper =
      write_file(dir, "improper.top",
                 "#include \"ff.itp\"\n[ moleculetype ]\nM 3\n[ atoms ]\n1 OW 1 M O 1 0\n2 HW 1 M H 1 0\n"
                 "3 HW 1 M H 1 0\n4 HW 1 M H 1 0\n[ dihedrals ]\n1 2 3 4 2 0 10\n");
  EXPECT_NE(error_of([&] {
              read_topology(harmonic_improper, {.include_dirs = {}, .defines = {}});
            }).find(harmonic_improper.string() + ":10: dihedral function 2 is not supported"),
            std::string::npos);
  fs::path missing = write_file(dir, "missing.top", "#include \"nowhere.itp\"\n");
  EXPECT_NE(error_of([&] {
              read_topology(missing, {.include_dirs = {}, .defines = {}});
            }).find(missing.string() + ":1: #include \"nowhere.itp\" not found"),
            std::string::npos);
  fs::path bad_atom =
      write_file(dir, "bad_atom.top", "#include \"ff.itp\"\n[ moleculetype ]\nM 3\n[ atoms ]\n1 XX 1 M O 1 0\n");
  EXPECT_NE(error_of([&] {
              read_topology(bad_atom, {.include_dirs = {}, .defines = {}});
            }).find(bad_atom.string() + ":5: atom type 'XX' is not in [ atomtypes ]"),
            std::string::npos);
  fs::path unknown = write_file(dir, "unknown.top", "#include \"ff.itp\"\n[ widgets ]\n1 2\n");
  EXPECT_NE(error_of([&] {
              read_topology(unknown, {.include_dirs = {}, .defines = {}});
            }).find(unknown.string() + ":2: unknown topology section [ widgets ]"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(Topology, ReadsGromacsDataOplsWater) {
  if (!fs::exists(kiln::md_test::gromacs_top() / "oplsaa.ff")) GTEST_SKIP() << "gromacs-data is not installed";
  MdSystem s = read_topology(kData / "topol.top");
  EXPECT_EQ(s.atom_count, 648);
  EXPECT_EQ(s.settles.size(), 216u);
  EXPECT_EQ(s.type_count, 2);
  EXPECT_DOUBLE_EQ(s.charges[0], -0.82);
  EXPECT_DOUBLE_EQ(s.masses[0], 15.9994);
  EXPECT_DOUBLE_EQ(s.masses[1], 1.008);
  // OPLS-AA is comb-rule 3; hydrogens have no LJ.
  EXPECT_DOUBLE_EQ(s.c6[s.types[1] * 2 + s.types[1]], 0.0);
  EXPECT_GT(s.c12[s.types[0] * 2 + s.types[0]], 0.0);
}

}  // namespace md_input_test
}  // namespace kiln::md
