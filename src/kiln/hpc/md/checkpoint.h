#pragma once
// Checkpoints of the CPU engine (kiln mdrun -cpo/-cpi, --cpt-steps): everything the next step
// depends on, so that a run resumed from one continues bit for bit as the run that wrote it would
// have. Doubles are stored as their bytes; the random generators (mt19937_64 and the barostat's
// normal distribution, which caches a draw) as their standard text form.
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

struct EngineCheckpoint {
  std::int64_t next_step = 0;               // the step the run continues with
  std::vector<Vec3> positions, velocities;  // x(next_step), v(next_step - dt/2)
  Vec3 box{};
  std::vector<Vec3> list_positions;  // where the current pair list was built (rebuilt from them)
  double thermostat_work = 0;        // kJ/mol, for Conserved En.
  std::string generators;            // "<mt19937_64> <normal_distribution>"
};

// The generators' text form both engines store in EngineCheckpoint::generators ("<mt19937_64>
// <normal_distribution>"), and its reading back (errors say the checkpoint's state is unreadable):
// one format, so either engine continues the other's checkpoint.
std::string generator_state(const std::mt19937_64& rng, const std::normal_distribution<double>& normal);
void restore_generators(const std::string& state, std::mt19937_64& rng, std::normal_distribution<double>& normal);

// Written atomically (atomic_write.h).
void write_checkpoint(const std::filesystem::path& path, const EngineCheckpoint& c);
// Errors name the file and what is wrong (not a kiln checkpoint, truncated, another atom count).
EngineCheckpoint read_checkpoint(const std::filesystem::path& path, int atom_count);

}  // namespace kiln::md
