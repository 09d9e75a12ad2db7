#pragma once
// GROMACS topologies (.top and the .itp files it #includes): a C-like preprocessor (#include,
// #define, #undef, #ifdef, #ifndef, #else, #endif, macro substitution) and the sections kiln mdrun
// supports, with bonded parameters looked up in [ bondtypes ], [ angletypes ], [ dihedraltypes ]
// and [ pairtypes ] (gen-pairs, fudgeLJ, fudgeQQ) as grompp does. Sections it does not support
// yet ([ constraints ], [ cmap ], virtual sites, ...) are refused by name and location when a
// molecule that has them is used in [ molecules ].
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kiln/hpc/md/md_system.h"

namespace kiln::md {

// Where GROMACS looks for #include files after the including file's folder: $GMXLIB, then
// Debian's gromacs-data (/usr/share/gromacs/top).
std::vector<std::filesystem::path> default_include_dirs();

struct Topology;

struct TopologyOptions {
  std::vector<std::filesystem::path> include_dirs = default_include_dirs();
  std::vector<std::string> defines;  // NAME or NAME=value, as mdp's define = -DNAME
};

// Reads and preprocesses `path`, then builds the flat system. Errors throw kiln::Error naming the
// file and line.
MdSystem read_topology(const std::filesystem::path& path, const TopologyOptions& options = {});

}  // namespace kiln::md
