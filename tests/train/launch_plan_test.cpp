// kiln launch's plan (launch_plan.h): the launcher commands it builds for one node, several nodes
// (mpirun hosts, Slurm), the restart command, refusals naming the flag; and the rank agent's exit
// records and the heartbeat file (what the supervisor reads).
#include "kiln/train/launch_plan.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "kiln/dist/launch_environment.h"
#include "kiln/runtime/error.h"
#include "kiln/train/heartbeat.h"
#include "kiln/train/rank_agent.h"

namespace kiln::train {
namespace launch_plan_test {

namespace fs = std::filesystem;
using Args = std::vector<std::string>;

LaunchOptions two_per_node() {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.command = {"kiln", "pretrain-gpt", "--save", "runs/a", "--save-interval", "4"};
  return o;
}

std::string error_of(const LaunchOptions& o, const std::optional<SlurmAllocation>& slurm = std::nullopt) {
  try {
    plan_launch(o, slurm);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchPlan, OneNodeUsesMpirunWithTheHeartbeatFolderExported) {
  const LaunchPlan p = plan_launch(two_per_node(), std::nullopt);
  EXPECT_EQ(p.launcher, "mpirun");
  EXPECT_EQ(p.world_size(), 2);
  EXPECT_EQ(p.save_dir, fs::path("runs/a"));
  EXPECT_EQ(job_argv(p, "/bin/kiln", p.command),
            (Args{"mpirun", "-np", "2", "-x", "KILN_HEARTBEAT_DIR", "/bin/kiln", "launch-rank", "--", "kiln",
                  "pretrain-gpt", "--save", "runs/a", "--save-interval", "4"}));
}

TEST(LaunchPlan, SeveralNodesPutTheMasterFirstAndPlaceNprocPerNode) {
  LaunchOptions o = two_per_node();
  o.nnodes = 3;
  o.hosts = {"n1", "n2", "n3"};
  o.master_addr = "n2";
  o.master_port = 29500;
  o.heartbeat_dir = "/shared/hb";
  o.launcher_args = {"--bind-to", "none"};
  const LaunchPlan p = plan_launch(o, std::nullopt);
  EXPECT_EQ(p.launcher_argv,
            (Args{"mpirun", "-np", "6", "--host", "n2:2,n1:2,n3:2", "--map-by", "ppr:2:node", "-x",
                  "KILN_HEARTBEAT_DIR", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "--bind-to", "none"}));
}

TEST(LaunchPlan, SlurmAllocationGivesNodesTasksAndSrun) {
  const std::map<std::string, std::string> env = {
      {"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NUM_NODES", "2"}, {"SLURM_NTASKS_PER_NODE", "4(x2)"}};
  const auto slurm = slurm_allocation_from([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  ASSERT_TRUE(slurm.has_value());
  EXPECT_EQ(slurm->nnodes, 2);
  EXPECT_EQ(slurm->ntasks_per_node, 4);
  LaunchOptions o = two_per_node();
  o.nproc_per_node = 0;  // from Slurm
  o.heartbeat_dir = "/shared/hb";
  const LaunchPlan p = plan_launch(o, slurm);
  EXPECT_EQ(p.launcher, "srun");
  EXPECT_EQ(p.launcher_argv, (Args{"srun", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--kill-on-bad-exit=1"}));
  // mpirun inside the allocation: Open MPI takes the allocation's nodes itself.
  o.launcher = "mpirun";
  EXPECT_EQ(plan_launch(o, slurm).launcher_argv,
            (Args{"mpirun", "-np", "8", "--map-by", "ppr:4:node", "-x", "KILN_HEARTBEAT_DIR"}));
  EXPECT_FALSE(slurm_allocation_from([](const char*) -> const char* { return nullptr; }).has_value());
}

TEST(LaunchPlan, RefusesNamingTheFlag) {
  LaunchOptions o = two_per_node();
  o.command.clear();
  EXPECT_NE(error_of(o).find("no command to run: put it after '--'"), std::string::npos);
  o = two_per_node();
  o.nproc_per_node = 0;
  EXPECT_NE(error_of(o).find("--nproc-per-node: missing"), std::string::npos);
  o = two_per_node();
  o.nnodes = 2;
  EXPECT_NE(error_of(o).find("--nnodes 2 outside a Slurm allocation: name the nodes with --hosts"), std::string::npos);
  o.hosts = {"a", "b"};
  EXPECT_NE(error_of(o).find("--nnodes 2: give --heartbeat-dir"), std::string::npos);
  o.node_rank = 1;
  EXPECT_NE(error_of(o).find("--node-rank 1: kiln launch starts the ranks of every node from one place"),
            std::string::npos);
  o = two_per_node();
  o.hosts = {"a", "b"};
  o.nnodes = 3;
  EXPECT_NE(error_of(o).find("--hosts names 2 node(s) (a,b), --nnodes is 3"), std::string::npos);
  o = two_per_node();
  o.launcher = "srun";
  EXPECT_NE(error_of(o).find("--launcher srun: not inside a Slurm allocation"), std::string::npos);
  o = two_per_node();
  o.max_restarts = -1;
  EXPECT_NE(error_of(o).find("--max-restarts: must be a whole number >= 0"), std::string::npos);
  SlurmAllocation one_node{.job_id = "7", .nnodes = 1, .ntasks_per_node = 2};
  o = two_per_node();
  o.nnodes = 2;
  o.heartbeat_dir = "/shared";
  EXPECT_NE(error_of(o, one_node).find("--nnodes 2: the Slurm allocation 7 has 1 node(s)"), std::string::npos);
}

TEST(LaunchPlan, RestartLoadsTheSaveFolderOnceItHoldsACheckpoint) {
  const fs::path save = fs::temp_directory_path() / ("kiln_launch_plan_" + std::to_string(::getpid()));
  fs::remove_all(save);
  fs::create_directories(save);
  const Args command = {"kiln", "pretrain-gpt", "--load", "base", "--finetune", "--save=" + save.string()};
  EXPECT_EQ(flag_value(command, "--save"), save.string());
  EXPECT_EQ(flag_value(command, "--load"), "base");
  EXPECT_EQ(restart_command(command, save), command);  // nothing saved yet: as it was
  fs::create_directories(save / "iter_0000004");
  EXPECT_EQ(restart_command(command, save), command);  // a folder without its manifest is not a checkpoint
  std::ofstream(save / "iter_0000004" / "manifest.json") << "{}";
  fs::create_directories(save / "iter_0000008");
  std::ofstream(save / "iter_0000008" / "manifest.json") << "{}";
  EXPECT_EQ(newest_checkpoint_folder(save), save / "iter_0000008");
  EXPECT_EQ(restart_command(command, save),
            (Args{"kiln", "pretrain-gpt", "--save=" + save.string(), "--load", save.string()}));
  fs::remove_all(save);
}

TEST(LaunchPlan, ShellTextQuotes) {
  EXPECT_EQ(shell_text({"bash", "-c", "echo 'a b'"}), "bash -c 'echo '\\''a b'\\'''");
}

TEST(RankAgent, ExitRecordsRoundTripAndDescribe) {
  const fs::path dir = fs::temp_directory_path() / ("kiln_rank_exit_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  write_rank_exit(dir, RankExit{.rank = 3, .unix_ns = 12, .signaled = true, .value = 9, .after_stop_request = false});
  const auto e = read_rank_exit(rank_exit_file(dir, 3));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(describe(*e), "rank 3 was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(describe(RankExit{.rank = 0, .value = 1}), "rank 0 exited with code 1");
  EXPECT_FALSE(read_rank_exit(rank_exit_file(dir, 4)).has_value());

  Heartbeat beat(dir, 5);
  beat.beat(123456);
  EXPECT_EQ(Heartbeat::read_iteration(dir / Heartbeat::file_name(5)), 123456);
  beat.beat(7);  // overwritten in place
  EXPECT_EQ(Heartbeat::read_iteration(dir / Heartbeat::file_name(5)), 7);
  beat.finish();
  EXPECT_EQ(Heartbeat::read_iteration(dir / Heartbeat::file_name(5)), -1);
  fs::remove_all(dir);
}

// Sets the launcher variables of a test and puts the process's own back afterwards.
class LauncherEnvironment {
 public:
  explicit LauncherEnvironment(const std::map<std::string, std::string>& values) {
    for (const char* name : kNames) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      ::unsetenv(name);
    }
    for (const auto& [name, value] : values) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~LauncherEnvironment() {
    for (const char* name : kNames) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  static constexpr const char* kNames[] = {"OMPI_COMM_WORLD_RANK",
                                           "OMPI_COMM_WORLD_SIZE",
                                           "OMPI_COMM_WORLD_LOCAL_RANK",
                                           "PMIX_RANK",
                                           "PMIX_SIZE",
                                           "PMI_RANK",
                                           "PMI_SIZE",
                                           "MPI_LOCALRANKID",
                                           "SLURM_PROCID",
                                           "SLURM_NTASKS",
                                           "SLURM_LOCALID",
                                           "SLURM_STEP_ID"};
  std::map<std::string, std::string> saved_;
};

TEST(LaunchEnvironment, RankSizeAndLocalRankFromEachLauncher) {
  {
    LauncherEnvironment env({});
    EXPECT_FALSE(dist::launch_position_from_environment().has_value());  // a plain run
  }
  {
    LauncherEnvironment env(
        {{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
    const auto p = dist::launch_position_from_environment();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->rank, 5);
    EXPECT_EQ(p->size, 8);
    EXPECT_EQ(p->local_rank, 1);
  }
  {  // srun --mpi=pmix: PMIx's rank, Slurm's task count and local id
    LauncherEnvironment env({{"PMIX_RANK", "3"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "3"}});
    const auto p = dist::launch_position_from_environment();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->rank, 3);
    EXPECT_EQ(p->size, 16);
    EXPECT_EQ(p->local_rank, 3);
  }
  {  // a batch script's own shell has SLURM_PROCID but is no step: not a rank
    LauncherEnvironment env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "16"}});
    EXPECT_FALSE(dist::launch_position_from_environment().has_value());
  }
  {  // a Slurm step without PMI
    LauncherEnvironment env(
        {{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"}});
    const auto p = dist::launch_position_from_environment();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->rank, 9);
    EXPECT_EQ(p->size, 16);
    EXPECT_EQ(p->local_rank, 1);
  }
}

}  // namespace launch_plan_test
}  // namespace kiln::train
