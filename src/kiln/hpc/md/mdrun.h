#pragma once
// kiln mdrun: GROMACS's grompp and mdrun in one step. Reads the .gro, .top and .mdp, checks them
// against each other, derives the Verlet buffer and the PME parameters, runs an engine and writes
// the energies (md.log table and energy.json), the final coordinates (confout.gro) and the
// performance figures.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/hpc/md/engine.h"
#include "kiln/hpc/md/gro_file.h"
#include "kiln/hpc/md/md_system.h"

namespace kiln::md {

struct MdrunSetup {
  MdSystem system;
  GroFrame frame;
  EngineSettings settings;
  MdState initial;
  std::vector<std::string> notes;  // what was derived, for the log
  // gmx mdrun -resethway: the performance figures count from the first energy frame in the run's
  // second half (before the last step), so that set-up, the first kernel launches and the first
  // pair-list build are left out of them.
  bool reset_halfway = false;
  // The trajectory files (gmx mdrun -x and -o); empty: traj.xtc and traj.trr in the output folder.
  // Written when the .mdp's nstxout-compressed, or nstxout / nstvout / nstfout, ask for them.
  std::filesystem::path xtc_path, trr_path;
};

// Errors name the file (and line) at fault; a box smaller than twice the cut-off is refused.
MdrunSetup prepare_mdrun(const std::filesystem::path& gro, const std::filesystem::path& top,
                         const std::filesystem::path& mdp);

// The GPU engine's pair lists as gmx mdrun sets them up for a GPU (verlet_buffer.h): with a positive
// verlet-buffer-tolerance, nstlist raised (from the .mdp's, or `nstlist_override` > 0 as gmx mdrun
// -nstlist), rlist from the buffer estimate, and (unless `dynamic_pruning` is false, as
// GMX_DISABLE_DYNAMICPRUNING) an inner list pruned in a rolling fashion. With tolerance -1 rlist
// stays as given and only the override applies. The choices go to the notes (md.log).
void plan_gpu_pair_lists(MdrunSetup& setup, int nstlist_override, bool dynamic_pruning);

// Domain decomposition over the ranks of `comm` (mpirun -np N): the grid (`requested`, as gmx
// mdrun -dd, or chosen: domain_decomposition.h), refused for the CUDA engine and for domains
// thinner than rlist. A world of one with no grid requested changes nothing.
void use_domain_decomposition(MdrunSetup& setup, const dist::Communicator& comm, std::array<int, 3> requested);

struct MdrunResult {
  std::vector<StepEnergies> energies;
  EngineCounters counters;
  double wall_seconds = 0;  // from the start, or from the half-way frame with reset_halfway
  std::int64_t timed_steps = 0;
  double ns_per_day = 0, hours_per_ns = 0;
  std::string engine;
  int ranks = 1;                                    // MPI ranks (domain decomposition): Core t counts them all
  std::vector<std::filesystem::path> trajectories;  // the files written
};

// Runs the CPU engine, or the CUDA engine with settings.use_gpu; the energy table goes to `log` (and md.log in outdir)
// as it is produced. With domain decomposition every rank calls this; rank 0 alone logs and writes the files.
MdrunResult run_mdrun(const MdrunSetup& setup, const std::filesystem::path& outdir, std::FILE* log);

// GROMACS's md.log layout: "Step Time" header, then names and values five to a row.
std::string format_energies(const StepEnergies& e, const MdSystem& system);
// The "Performance:" block of mdrun's log.
std::string format_performance(const MdrunResult& r);
std::string energies_json(const std::vector<StepEnergies>& energies, const MdSystem& system);

}  // namespace kiln::md
