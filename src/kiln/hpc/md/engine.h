#pragma once
// The seam between the MD driver (files, checks, output: mdrun.h) and an engine that owns the
// state and advances it. The CPU engine (cpu_engine.h) is the reference; a GPU engine keeps
// coordinates, velocities and forces resident on the device between neighbour searches and only
// hands back energies at energy steps and the state at the end, so the driver never asks for
// per-step data.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/hpc/md/checkpoint.h"
#include "kiln/hpc/md/md_system.h"
#include "kiln/hpc/md/mdp_options.h"
#include "kiln/hpc/md/pme_decomposition.h"
#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

// GROMACS's energy terms (gmx energy names) at one step.
struct StepEnergies {
  std::int64_t step = 0;
  double time = 0;
  double lj = 0, coulomb_sr = 0, coulomb_recip = 0, bond = 0, angle = 0;
  double proper_dih = 0, rb_dih = 0, improper_dih = 0, lj14 = 0, coulomb14 = 0;
  bool has_recip = true;  // false with reaction-field, as gmx energy then has no Coul. recip.
  // DispCorr (dispersion_correction.h): "Disper. corr." in the potential and "Pres. DC" (bar) in the
  // pressure, both listed whenever DispCorr is not no (Pres. DC is 0 with Ener and AllEner), as GROMACS.
  bool has_dispcorr = false;
  double disp_corr = 0, pres_dc = 0;
  double potential = 0, kinetic = 0, total = 0, conserved = 0, temperature = 0;
  double pressure = 0;     // bar: (2 Ekin + virial of forces and constraints) / (3 V)
  double constr_rmsd = 0;  // rms relative deviation of the LINCS constraints after the step
  // With pressure coupling (gmx energy's Box-X/Y/Z, Volume, Density, pV, Enthalpy): the box at the step.
  bool has_box = false;
  Vec3 box{};
  void set_box_terms(const Vec3& b) {
    has_box = true;
    box = b;
  }
  // The sum of the potential terms above, into `potential`.
  void sum_potential() {
    potential = lj + disp_corr + coulomb_sr + coulomb_recip + bond + angle + proper_dih + rb_dih + improper_dih + lj14 +
                coulomb14;
  }
};

// Names and values in GROMACS's order, terms the system has no interactions for left out.
std::vector<std::pair<std::string, double>> named_terms(const StepEnergies& e, const MdSystem& system);

struct MdState {
  std::vector<Vec3> positions;   // nm, at the current step
  std::vector<Vec3> velocities;  // nm/ps, at half a step before it (leap-frog)
  Vec3 box{};
};

// The state at one step, for the trajectory files: x(t), v(t - dt/2) (leap-frog's, as GROMACS
// writes them) and f(t).
struct StepState {
  std::int64_t step = 0;
  double time = 0;
  const Vec3& box;
  const std::vector<Vec3>& positions;
  const std::vector<Vec3>& velocities;
  const std::vector<Vec3>& forces;
};

// Whether any of nstxout-compressed, nstxout, nstvout, nstfout asks for this step.
inline bool trajectory_step(const MdpOptions& o, std::int64_t step) {
  for (std::int64_t every : {o.nstxout_compressed, o.nstxout, o.nstvout, o.nstfout})
    if (every > 0 && step % every == 0) return true;
  return false;
}

// Everything an engine needs that the driver derived from the inputs.
struct EngineSettings {
  MdpOptions mdp;
  double cutoff = 1.0;  // rc = rvdw = rcoulomb
  double rlist = 1.1;   // pair-list radius (cutoff + buffer); the outer list's with dynamic pruning
  // Dynamic pruning (GPU engine; verlet_buffer.h's plan): with nstlist_prune > 0 an inner list of
  // the outer list's cluster pairs within rlist_inner is pruned from it, one of prune_parts parts
  // every nstlist_prune / prune_parts steps (all of it at each outer build), and the non-bonded
  // kernel walks only that. 0: one list.
  int nstlist_prune = 0;
  double rlist_inner = 0;
  int prune_parts = 1;
  double beta = 3.12;           // Ewald coefficient
  bool reaction_field = false;  // coulombtype = Reaction-Field: no PME
  double k_rf = 0, c_rf = 0;
  std::array<int, 3> pme_grid{};
  int degrees_of_freedom = 0;
  int threads = 1;  // CPU threads (the CPU engine's pair loop)
  // The GPU engine (make_cuda_engine): which device, and double instead of mixed precision.
  bool use_gpu = false;
  int gpu_index = 0;
  bool gpu_double = false;
  // Checkpoints (both engines; the same files): `on_checkpoint` gets the state every checkpoint_steps steps and at the
  // last step (the state confout.gro holds, from which a longer run continues); with
  // `resume`, the run continues from it (the initial MdState is then ignored).
  std::int64_t checkpoint_steps = 0;
  std::function<void(const EngineCheckpoint&)> on_checkpoint;
  std::shared_ptr<const EngineCheckpoint> resume;
  // Trajectory output (CPU engine): called at every trajectory_step, before the step's update.
  std::function<void(const StepState&)> on_frame;
  // Domain decomposition (CPU engine, domain_decomposition.h): with dd_comm, one domain of the
  // dd_grid per rank of it; every rank runs the engine, rank 0 alone gets on_energies' frames with
  // the sums, on_frame, on_checkpoint and state() in the global atom order.
  std::shared_ptr<const dist::Communicator> dd_comm;
  std::array<int, 3> dd_grid{1, 1, 1};
  // PME under domain decomposition: the grid's planes along one axis split over the ranks (pme_decomposition.h),
  // or every rank solving the whole all-reduced grid (mdrun --pme-decomposition).
  PmeDecomposition pme_decomposition = PmeDecomposition::Slab;
};

struct EngineCounters {
  std::int64_t pair_list_builds = 0;
  // Domain decomposition: atoms that moved to another rank at search steps, over all ranks.
  std::int64_t migrated_atoms = 0;
  std::int64_t early_rebuilds = 0;  // rebuilt before nstlist: two atoms could have used up the buffer
  std::size_t pairs_in_list = 0;
  // The GPU engine's list: 8 x 8 cluster pairs, and the steps at which the two largest
  // displacements since the last build reached the buffer (its list is rebuilt every nstlist steps
  // only, as GROMACS's, so a pair could then have entered the cut-off unlisted).
  std::size_t cluster_pairs = 0;
  std::int64_t buffer_exceeded_steps = 0;
  // With dynamic pruning: the inner list's cluster pairs after the last prune, the prunes run, and
  // the atom pairs within the cut-off (at energy steps) that the inner list lacked while the outer
  // list had them: what pruning dropped that interacted (GROMACS's buffer estimate allows a rare one).
  std::size_t inner_cluster_pairs = 0;
  std::int64_t prunes = 0;
  std::int64_t pruned_pairs_in_cutoff = 0;
  // The CPU engine's PME under domain decomposition, over all ranks: calls (per rank), seconds in
  // them (the slowest rank's sum) and bytes sent to other ranks by all ranks together (the
  // replicated grid's all-reduce counted as each rank's grid, its payload).
  std::int64_t pme_calls = 0;
  double pme_seconds = 0;
  std::int64_t pme_bytes_sent = 0;
};

class MdEngine {
 public:
  virtual ~MdEngine() = default;
  virtual std::string name() const = 0;
  // Runs steps [0, nsteps] of leap-frog (nsteps updates), calling `on_energies` at every nstenergy
  // step and the last. Throws kiln::Error when forces blow up (naming the atoms) or constraints fail.
  virtual void run(const std::function<void(const StepEnergies&)>& on_energies) = 0;
  virtual MdState state() const = 0;
  virtual EngineCounters counters() const = 0;
};

std::unique_ptr<MdEngine> make_cpu_engine(const MdSystem& system, const EngineSettings& settings, MdState initial);

// The CUDA engine (cuda/cuda_engine.cpp) on settings.gpu_index: cluster-pair list, non-bonded and
// PME (cuFFT), bonded terms, leap-frog, v-rescale, SETTLE and LINCS on the device, state resident there;
// float arithmetic for forces unless settings.gpu_double. Fails in a build without CUDA.
std::unique_ptr<MdEngine> make_cuda_engine(const MdSystem& system, const EngineSettings& settings, MdState initial);

// One force evaluation of the CUDA engine at positions x (the list built for x), for tests.
struct GpuForceResult {
  std::vector<Vec3> forces;
  StepEnergies energies;  // the potential terms
  double virial_trace = 0;
  std::size_t cluster_pairs = 0;
  std::size_t inner_cluster_pairs = 0;      // with settings.rlist_inner > 0: kept by the prune at x
  std::int64_t pruned_pairs_in_cutoff = 0;  // atom pairs within rc at x in pruned-away cluster pairs
};
// With `list_x`, the (outer) list is built at list_x and, when settings.nstlist_prune > 0, pruned
// at x with rlist_inner before the forces at x are computed from it.
GpuForceResult cuda_force_evaluation(const MdSystem& system, const EngineSettings& settings, const std::vector<Vec3>& x,
                                     const Vec3& box, const std::vector<Vec3>* list_x = nullptr);

}  // namespace kiln::md
