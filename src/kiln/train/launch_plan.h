#pragma once
// `kiln launch` before anything runs (docs/launch.md): its flags and the Slurm allocation it may be
// inside turned into the command that starts every rank (Open MPI's mpirun, or srun), and the
// user's command rewritten for a restart (resume from the newest checkpoint of its --save). Pure
// functions of their inputs, so the commands are checked by unit tests without starting anything.
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::train {

struct LaunchOptions {
  int nproc_per_node = 0;  // 0: not given (Slurm's SLURM_NTASKS_PER_NODE, else an error)
  int nnodes = 0;          // 0: not given (Slurm's node count, else 1)
  int node_rank = 0;
  std::string master_addr;                 // the node of rank 0 (first in the host list); exported as MASTER_ADDR
  int master_port = 0;                     // exported as MASTER_PORT; Kiln's ranks meet through MPI and do not use it
  std::vector<std::string> hosts;          // --hosts: the nodes, for mpirun across nodes outside Slurm
  std::string hostfile;                    // --hostfile: Open MPI's host file instead
  std::string launcher = "auto";           // auto (srun inside a Slurm allocation, else mpirun), mpirun, srun
  std::vector<std::string> launcher_args;  // --launcher-args, split at spaces: given to the launcher as they are
  int max_restarts = 0;
  double heartbeat_timeout = 600;    // seconds without a beat (after a rank's first) that count as a hang; 0: off
  double startup_timeout = 1800;     // seconds for each rank's first beat; 0: no limit
  std::string heartbeat_dir;         // "": a fresh folder under $TMPDIR (one node only)
  std::vector<std::string> command;  // after `--`
};

// A Slurm allocation this process runs in (sbatch / salloc), from SLURM_* variables.
struct SlurmAllocation {
  std::string job_id;
  int nnodes = 1;                      // SLURM_JOB_NUM_NODES (or SLURM_NNODES)
  std::optional<int> ntasks_per_node;  // SLURM_NTASKS_PER_NODE's first count ("4(x2)" -> 4)
};

// From `lookup` (a variable's value, nullptr when unset), or nullopt outside Slurm (no SLURM_JOB_ID).
std::optional<SlurmAllocation> slurm_allocation_from(const std::function<const char*(const char*)>& lookup);
std::optional<SlurmAllocation> slurm_allocation_from_environment();

struct LaunchPlan {
  std::string launcher;  // "mpirun" or "srun"
  int nnodes = 1, nproc_per_node = 1;
  int world_size() const { return nnodes * nproc_per_node; }
  // The launcher and its arguments; the rank agent (`<kiln> launch-rank --`) and the command follow.
  std::vector<std::string> launcher_argv;
  std::vector<std::string> command;
  std::filesystem::path save_dir;  // the command's --save ("" : none: a restart starts afresh)
  std::vector<std::string> notes;  // what launch should tell the user before it starts
};

// Checks the options (errors name the flag and the value) and builds the plan.
LaunchPlan plan_launch(const LaunchOptions& options, const std::optional<SlurmAllocation>& slurm);

// The whole command of one attempt: launcher, the rank agent (`self_exe launch-rank --`), command.
std::vector<std::string> job_argv(const LaunchPlan& plan, const std::string& self_exe,
                                  const std::vector<std::string>& command);

// The value of `flag` in a command ("--save X" or "--save=X"; the last one wins), or nullopt.
std::optional<std::string> flag_value(const std::vector<std::string>& command, std::string_view flag);

// The command of a restart: it resumes from `save_dir` (--load save_dir, replacing another
// --load, without --finetune / --no-load-optim, which would throw away the run's own progress)
// when that folder holds a checkpoint; otherwise the command as it was.
std::vector<std::string> restart_command(const std::vector<std::string>& command,
                                         const std::filesystem::path& save_dir);

// The newest iter_* folder of a --save directory that has its manifest (what a resume will try
// first), or nullopt.
std::optional<std::filesystem::path> newest_checkpoint_folder(const std::filesystem::path& save_dir);

// "mpirun -np 2 ..." for logs (arguments with spaces quoted).
std::string shell_text(const std::vector<std::string>& argv);

}  // namespace kiln::train
