#pragma once
// `kiln launch`'s watch over a running job (docs/launch.md). Each attempt starts the job's command
// (the launcher, mpirun or srun, with every rank under a rank agent: rank_agent.h) in a process
// group of its own, with KILN_HEARTBEAT_DIR pointing at a fresh folder, and watches:
//   - the job ends with 0: done;
//   - the job ends otherwise: the rank agents' records name the rank that failed first, and how;
//   - a rank's heartbeat (heartbeat.h) stops changing for heartbeat_timeout seconds after its first
//     beat, or gives no first beat within startup_timeout seconds: a hang; the whole job is stopped
//     (SIGTERM to its process group, SIGKILL after kill_grace seconds).
// A failed attempt is followed by another (the command from `command_for_attempt`, which resumes
// from the newest checkpoint) while restarts are left. SIGINT / SIGTERM to the supervisor stop the
// job and end the supervision (no restart).
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace kiln::train {

struct SupervisorOptions {
  int world_size = 1;
  int max_restarts = 0;
  double heartbeat_timeout = 600;        // 0: hangs are not watched
  double startup_timeout = 1800;         // 0: no limit on the first beat
  double kill_grace = 10;                // seconds between SIGTERM and SIGKILL when the supervisor stops a job
  std::filesystem::path heartbeat_root;  // attempt_<k>/ folders go here
  // The argv of attempt k (0: the first run; k >= 1: the k-th restart).
  std::function<std::vector<std::string>(int attempt)> command_for_attempt;
  std::function<void(const std::string&)> log;  // one line each
};

struct SupervisorResult {
  int exit_code = 0;   // 0: the job succeeded; else what launch exits with
  int restarts = 0;    // restarts made
  std::string reason;  // why the last attempt failed ("" on success)
};

SupervisorResult supervise_job(const SupervisorOptions& options);

}  // namespace kiln::train
