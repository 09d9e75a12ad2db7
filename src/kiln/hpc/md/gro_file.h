#pragma once
// GROMACS .gro coordinates: a title line, the atom count, one fixed-column line per atom (residue
// number, residue name, atom name, atom number, x y z in nm, optionally vx vy vz in nm/ps) and the
// box line. Only rectangular boxes are accepted (a triclinic box line is refused by name).
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

struct GroFrame {
  std::string title;
  std::vector<int> residue_numbers;
  std::vector<std::string> residue_names;
  std::vector<std::string> atom_names;
  std::vector<Vec3> positions;
  std::vector<Vec3> velocities;  // empty when the file has none
  Vec3 box{};
};

// Errors throw kiln::Error naming `<name>:<line>` and what is wrong.
GroFrame parse_gro(const std::string& text, const std::string& name);
GroFrame read_gro(const std::filesystem::path& path);
// GROMACS's own layout (%8.3f positions, %8.4f velocities), written atomically.
std::string format_gro(const GroFrame& frame);
void write_gro(const std::filesystem::path& path, const GroFrame& frame);

}  // namespace kiln::md
