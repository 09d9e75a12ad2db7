#pragma once
// Small molecules from gromacs-data's force fields, alone in a 3 nm box, for the listed-term
// (md_listed_test.cpp) and LINCS (md_lincs_test.cpp) tests: 1-propanol (OPLS-AA's 1propanol.itp)
// and urea (AMBER99SB-ILDN's urea.itp with the [ angles ] and [ pairs ] it lacks, as
// solvate_molecule.py adds them).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "gromacs_data.h"
#include "kiln/hpc/md/mdrun.h"

namespace kiln::md_test {

inline bool have_force_fields() {
  const std::filesystem::path top = gromacs_top();
  return std::filesystem::exists(top / "oplsaa.ff/1propanol.itp") &&
         std::filesystem::exists(top / "amber99sb-ildn.ff/urea.itp");
}

struct Molecule {
  const char* name;
  const char* top;  // after the force field's forcefield.itp
  const char* atoms;
};

// Coordinates as solvate_molecule.py builds them (displaced up to 0.01 nm off every extremum).
inline const Molecule kPropanol{"propanol", R"(#include "oplsaa.ff/forcefield.itp"
#include "oplsaa.ff/1propanol.itp"
[ system ]
propanol
[ molecules ]
POL 1
)",
                                R"(    1POL      C    1   1.082   0.875   0.939
    1POL      H    2   1.104   0.918   1.018
    1POL      H    3   1.113   0.756   0.925
    1POL      H    4   1.111   0.911   0.842
    1POL      C    5   0.911   0.857   0.936
    1POL      H    6   0.893   0.814   0.844
    1POL      H    7   0.878   0.799   1.021
    1POL      C    8   0.865   1.011   0.934
    1POL      H    9   0.903   1.058   0.847
    1POL      H   10   0.896   1.065   1.021
    1POL     OA   11   0.719   0.993   0.931
    1POL     HO   12   0.693   1.091   0.938
)"};
inline const Molecule kUrea{"urea", R"(#include "amber99sb-ildn.ff/forcefield.itp"
#include "amber99sb-ildn.ff/urea.itp"
[ angles ]
 2 1 3
 2 1 6
 3 1 6
 1 3 4
 1 3 5
 4 3 5
 1 6 7
 1 6 8
 7 6 8
[ pairs ]
 2 4 1
 2 5 1
 2 7 1
 2 8 1
 3 7 1
 3 8 1
 6 4 1
 6 5 1
[ system ]
urea
[ molecules ]
URE 1
)",
                            R"(    1URE      C    1   0.940   0.989   0.939
    1URE      O    2   0.923   1.105   0.930
    1URE     N1    3   1.046   0.904   0.925
    1URE    H11    4   1.133   0.955   0.930
    1URE    H12    5   1.034   0.802   0.935
    1URE     N2    6   0.815   0.912   0.936
    1URE    H21    7   0.725   0.952   0.937
    1URE    H22    8   0.820   0.814   0.933
)"};

// The molecule in a 3 nm box with the run parameters of `mdp`.
inline md::MdrunSetup molecule_in_a_box(const Molecule& m, const std::filesystem::path& mdp) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / fmt::format("kiln_md_listed_{}_{}", m.name, ::getpid());
  fs::create_directories(dir);
  {
    std::ofstream(dir / "topol.top") << m.top;
    std::string atoms = m.atoms;
    std::ofstream(dir / "conf.gro") << m.name << "\n"
                                    << std::count(atoms.begin(), atoms.end(), '\n') << "\n"
                                    << atoms << "   3.00000   3.00000   3.00000\n";
  }
  md::MdrunSetup s = md::prepare_mdrun(dir / "conf.gro", dir / "topol.top", mdp);
  fs::remove_all(dir);
  return s;
}

}  // namespace kiln::md_test
