#pragma once
// Where a launcher (mpirun / mpiexec, srun, `kiln launch`) placed this process, read from the
// environment it sets, before (and without) MPI: Open MPI's OMPI_COMM_WORLD_*, PMIx's PMIX_RANK,
// PMI's PMI_RANK / PMI_SIZE, Slurm's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID. Fault injection
// and the heartbeat (kiln launch) name their files by this rank; MPI's own rank is the same number.
#include <optional>

namespace kiln::dist {

struct LaunchPosition {
  int rank = 0;        // in the whole job
  int size = 1;        // ranks in the job
  int local_rank = 0;  // among the ranks of this node (picks the GPU)
};

// The position the environment gives, or nullopt when no launcher started this process (a plain
// run). Open MPI's variables win over PMIx/PMI's, and those over Slurm's (a `srun` step's
// SLURM_PROCID is the task's; a batch script's own shell has SLURM_PROCID=0 too, so Slurm's are
// used only when SLURM_STEP_ID says this is a step).
std::optional<LaunchPosition> launch_position_from_environment();

}  // namespace kiln::dist
