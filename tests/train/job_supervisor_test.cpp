// kiln launch's supervisor (job_supervisor.h) without MPI: small shell jobs play the ranks, writing
// heartbeat files and rank agents' exit records as pretrain-gpt and `kiln launch-rank` do.
#include "kiln/train/job_supervisor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace kiln::train {
namespace job_supervisor_test {

namespace fs = std::filesystem;

struct Supervised {
  SupervisorResult result;
  std::vector<std::string> log;
};

// Runs `scripts[k]` (bash) as attempt k; the last one again if there are more attempts.
Supervised supervise(const std::vector<std::string>& scripts, int max_restarts, double heartbeat_timeout,
                     double startup_timeout) {
  const fs::path root = fs::temp_directory_path() / ("kiln_supervisor_" + std::to_string(::getpid()));
  fs::remove_all(root);
  Supervised s;
  SupervisorOptions o;
  o.world_size = 2;
  o.max_restarts = max_restarts;
  o.heartbeat_timeout = heartbeat_timeout;
  o.startup_timeout = startup_timeout;
  o.kill_grace = 5;
  o.heartbeat_root = root;
  o.command_for_attempt = [&](int attempt) {
    return std::vector<std::string>{
        "bash", "-c", scripts[std::min<std::size_t>(static_cast<std::size_t>(attempt), scripts.size() - 1)]};
  };
  o.log = [&](const std::string& line) { s.log.push_back(line); };
  s.result = supervise_job(o);
  fs::remove_all(root);
  return s;
}

bool logged(const Supervised& s, const std::string& text) {
  for (const auto& line : s.log)
    if (line.find(text) != std::string::npos) return true;
  return false;
}

TEST(JobSupervisor, ASilentRankIsAHangAndTheJobIsRestarted) {
  // Attempt 0: rank 0 beats iteration 1, rank 1 iteration 2, then both stop; attempt 1 succeeds.
  const Supervised s = supervise({"printf '%20s\\n' 1 > $KILN_HEARTBEAT_DIR/rank_0; "
                                  "printf '%20s\\n' 2 > $KILN_HEARTBEAT_DIR/rank_1; exec sleep 60",
                                  "exit 0"},
                                 /*max_restarts=*/2, /*heartbeat_timeout=*/0.5, /*startup_timeout=*/0);
  EXPECT_EQ(s.result.exit_code, 0);
  EXPECT_EQ(s.result.restarts, 1);
  EXPECT_TRUE(logged(s, "kiln launch: rank 0 hung: no heartbeat for ")) << ::testing::PrintToString(s.log);
  EXPECT_TRUE(logged(s, "its last beat was at the start of iteration 1 (the others: rank 1 at iteration 2)"))
      << ::testing::PrintToString(s.log);
}

TEST(JobSupervisor, AgentRecordsNameTheRankThatFailedFirst) {
  // Rank 0 was stopped by the launcher after rank 1 was SIGKILLed; the launcher exits with 3.
  const Supervised s = supervise({"echo '0 200 code 1 1' > $KILN_HEARTBEAT_DIR/rank_0.exit; "
                                  "echo '1 100 signal 9 0' > $KILN_HEARTBEAT_DIR/rank_1.exit; exit 3"},
                                 /*max_restarts=*/1, 0, 0);
  EXPECT_EQ(s.result.exit_code, 3);
  EXPECT_EQ(s.result.restarts, 1);
  EXPECT_EQ(s.result.reason,
            "rank 1 was killed by signal 9 (SIGKILL) (then: rank 0 exited with code 1 after the launcher stopped it)");
  EXPECT_TRUE(logged(s, "kiln launch: attempt 2 failed: rank 1 was killed by signal 9 (SIGKILL)"));
}

TEST(JobSupervisor, NoFirstBeatWithinTheStartupTimeoutIsAHang) {
  const Supervised s = supervise({"exec sleep 60"}, /*max_restarts=*/0, /*heartbeat_timeout=*/600,
                                 /*startup_timeout=*/0.3);
  EXPECT_EQ(s.result.exit_code, 1);
  EXPECT_EQ(s.result.reason,
            "rank 0 hung before training: no first heartbeat within 0.3 s of the start (--startup-timeout)");
}

TEST(JobSupervisor, ARankThatIsDoneIsNotWatchedAnyMore) {
  // Both ranks beat and say done, then the job takes longer than the heartbeat timeout and succeeds.
  const Supervised s = supervise({"printf '%20s\\n' done > $KILN_HEARTBEAT_DIR/rank_0; "
                                  "printf '%20s\\n' done > $KILN_HEARTBEAT_DIR/rank_1; sleep 1"},
                                 /*max_restarts=*/0, /*heartbeat_timeout=*/0.3, /*startup_timeout=*/0);
  EXPECT_EQ(s.result.exit_code, 0) << s.result.reason;
  EXPECT_EQ(s.result.restarts, 0);
}

}  // namespace job_supervisor_test
}  // namespace kiln::train
