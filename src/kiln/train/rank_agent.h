#pragma once
// The process `kiln launch` puts between the launcher and each rank (`kiln launch-rank -- CMD`):
// it runs CMD as its child, and when the child ends it records how (exit code or signal, when,
// and whether the launcher had told it to stop) in <KILN_HEARTBEAT_DIR>/rank_<R>.exit, then ends
// the same way, so mpirun / srun see what they would have seen. A rank killed by SIGKILL cannot
// say so itself; its agent can, and the supervisor then names the rank and the signal.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace kiln::train {

struct RankExit {
  int rank = 0;
  std::int64_t unix_ns = 0;  // when the agent saw the child end
  bool signaled = false;     // killed by signal `value`, else exited with code `value`
  int value = 0;
  bool after_stop_request = false;  // the launcher had sent SIGTERM/SIGINT first (a consequence, not a cause)
  bool failed() const { return signaled || value != 0; }
};

// "rank 1 was killed by signal 9 (SIGKILL)", "rank 0 exited with code 1"
std::string describe(const RankExit& e);

// rank_<R>.exit, written atomically (temp + rename).
std::filesystem::path rank_exit_file(const std::filesystem::path& dir, int rank);
void write_rank_exit(const std::filesystem::path& dir, const RankExit& e);
std::optional<RankExit> read_rank_exit(const std::filesystem::path& file);

// Runs `command` as described above; returns only when it cannot end like its child (then the
// exit code). Needs KILN_HEARTBEAT_DIR and a launcher's rank in the environment.
int run_rank_agent(const std::vector<std::string>& command);

}  // namespace kiln::train
