// `kiln launch`: start a job of one process per GPU on one or more nodes (mpirun, or srun inside a
// Slurm allocation), watch it, and restart it from its newest checkpoint when a rank dies or hangs
// (docs/launch.md). `kiln launch-rank` is the per-rank agent launch puts under the launcher.
#include <fmt/format.h>
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>

#include "commands.h"
#include "kiln/runtime/error.h"
#include "kiln/train/job_supervisor.h"
#include "kiln/train/launch_plan.h"
#include "kiln/train/rank_agent.h"
#include "number_checks.h"

namespace kiln::cli {

namespace {

namespace fs = std::filesystem;

std::vector<std::string> split(const std::string& text, char by) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, by))
    if (!item.empty()) out.push_back(item);
  return out;
}

void say(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

struct LaunchFlags {
  train::LaunchOptions options;
  std::string hosts, launcher_args;
  double kill_grace = 10;
};

void run_launch(LaunchFlags& f) {
  train::LaunchOptions& o = f.options;
  o.hosts = split(f.hosts, ',');
  o.launcher_args = split(f.launcher_args, ' ');
  const train::LaunchPlan plan = train::plan_launch(o, train::slurm_allocation_from_environment());
  if (!o.master_addr.empty()) ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  if (o.master_port != 0) ::setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);

  // The heartbeat folder: the user's (several nodes need a shared one), else a private temporary one.
  fs::path root;
  bool temporary = false;
  if (!o.heartbeat_dir.empty()) {
    root = o.heartbeat_dir;
    std::error_code ec;
    fs::create_directories(root, ec);
    KILN_CHECK(!ec, "--heartbeat-dir {}: cannot create it: {}", root.string(), ec.message());
  } else {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kiln-launch.XXXXXX";
    KILN_CHECK(::mkdtemp(pattern.data()) != nullptr, "kiln launch: cannot create a heartbeat folder {}: {}", pattern,
               std::strerror(errno));
    root = pattern;
    temporary = true;
  }
  const std::string self = fs::read_symlink("/proc/self/exe").string();

  say(fmt::format("kiln launch: {} rank(s) ({} node(s) x {}) through {}; {}; up to {} restart(s)", plan.world_size(),
                  plan.nnodes, plan.nproc_per_node, plan.launcher,
                  o.heartbeat_timeout > 0 ? fmt::format("a rank silent for {} s counts as hung", o.heartbeat_timeout)
                                          : std::string("hangs are not watched (--heartbeat-timeout 0)"),
                  o.max_restarts));
  for (const auto& note : plan.notes) say("kiln launch: note: " + note);

  train::SupervisorOptions s;
  s.world_size = plan.world_size();
  s.max_restarts = o.max_restarts;
  s.heartbeat_timeout = o.heartbeat_timeout;
  s.startup_timeout = o.startup_timeout;
  s.kill_grace = f.kill_grace;
  s.heartbeat_root = root;
  s.log = say;
  s.command_for_attempt = [&](int attempt) {
    std::vector<std::string> command = plan.command;
    if (attempt > 0) {
      command = train::restart_command(plan.command, plan.save_dir);
      const auto newest = plan.save_dir.empty() ? std::nullopt : train::newest_checkpoint_folder(plan.save_dir);
      say(fmt::format("kiln launch: restart {} of {} (--max-restarts): {}", attempt, o.max_restarts,
                      newest ? fmt::format("resuming from --load {} (newest checkpoint folder: {}; the command "
                                           "verifies it and passes over a damaged one)",
                                           plan.save_dir.string(), newest->filename().string())
                             : std::string("no checkpoint yet: the command starts from the beginning")));
    }
    const auto argv = train::job_argv(plan, self, command);
    say("kiln launch: running " + train::shell_text(argv));
    return argv;
  };
  const train::SupervisorResult result = train::supervise_job(s);
  if (temporary) {
    std::error_code ignored;
    fs::remove_all(root, ignored);
  }
  if (result.exit_code == 0) {
    say(fmt::format("kiln launch: the job succeeded{}",
                    result.restarts > 0 ? fmt::format(" after {} restart(s)", result.restarts) : std::string()));
    return;
  }
  say(fmt::format("kiln launch: error: the job failed and {}: {}",
                  result.reason.rfind("stopped by", 0) == 0
                      ? std::string("was not restarted")
                      : fmt::format("no restart is left ({} made, --max-restarts {})", result.restarts, o.max_restarts),
                  result.reason));
  throw CLI::RuntimeError(result.exit_code);
}

}  // namespace

void add_launch(CLI::App& app) {
  auto f = std::make_shared<LaunchFlags>();
  auto& o = f->options;
  auto* cmd = app.add_subcommand(
      "launch",
      "Run a command as a job of one process per GPU (mpirun, or srun in a Slurm allocation); restart it from its "
      "newest checkpoint when a rank dies or hangs");
  cmd->footer(
      "Example (2 ranks on this node, up to 3 restarts):\n"
      "  kiln launch --nproc-per-node 2 --max-restarts 3 -- kiln pretrain-gpt ... --save runs/gpt --save-interval 100\n"
      "See docs/launch.md.");
  cmd->add_option("--nproc-per-node", o.nproc_per_node,
                  "processes per node, one per GPU (default inside Slurm: SLURM_NTASKS_PER_NODE)")
      ->check(whole_number_at_least(1));
  cmd->add_option("--nnodes", o.nnodes, "nodes (default: Slurm's node count, else the --hosts, else 1)")
      ->check(whole_number_at_least(1));
  cmd->add_option("--node-rank", o.node_rank,
                  "must be 0: one kiln launch, on the first node, starts the ranks of every node")
      ->check(whole_number_at_least(0));
  cmd->add_option("--master-addr", o.master_addr,
                  "the node of rank 0 (put first among --hosts); exported as MASTER_ADDR");
  cmd->add_option("--master-port", o.master_port,
                  "exported as MASTER_PORT (Kiln's ranks meet through MPI and do not need it)")
      ->check(whole_number_at_least(0));
  cmd->add_option("--hosts", f->hosts, "the nodes for mpirun across nodes outside Slurm: host1,host2,...");
  cmd->add_option("--hostfile", o.hostfile, "Open MPI host file, instead of --hosts");
  cmd->add_option("--launcher", o.launcher, "auto (srun inside a Slurm allocation, else mpirun), mpirun or srun")
      ->capture_default_str();
  cmd->add_option(
      "--launcher-args", f->launcher_args,
      "more arguments for the launcher, one string split at spaces (e.g. '--oversubscribe --bind-to none')");
  cmd->add_option("--max-restarts", o.max_restarts, "restarts after a failure before giving up")
      ->capture_default_str()
      ->check(whole_number_at_least(0));
  cmd->add_option("--heartbeat-timeout", o.heartbeat_timeout,
                  "seconds a rank may go without a heartbeat (one per training iteration) before the job counts as "
                  "hung and is restarted; 0: off")
      ->capture_default_str()
      ->check(finite_number_above(0, true));
  cmd->add_option("--startup-timeout", o.startup_timeout,
                  "seconds each rank has for its first heartbeat (start-up, data, checkpoint loading); 0: no limit")
      ->capture_default_str()
      ->check(finite_number_above(0, true));
  cmd->add_option("--kill-grace", f->kill_grace, "seconds between SIGTERM and SIGKILL when launch stops a job")
      ->capture_default_str()
      ->check(finite_number_above(0, true));
  cmd->add_option("--heartbeat-dir", o.heartbeat_dir,
                  "where ranks beat (default: a new folder under $TMPDIR; several nodes need a shared one)");
  cmd->add_option("command", o.command, "the command every rank runs, after '--'");
  cmd->callback([f] { run_launch(*f); });

  auto command = std::make_shared<std::vector<std::string>>();
  auto* rank = app.add_subcommand("launch-rank", "per-rank agent of kiln launch (started by it, not by hand)");
  rank->group("");  // hidden from --help
  rank->add_option("command", *command, "the rank's command, after '--'");
  rank->callback([command] {
    const int code = train::run_rank_agent(*command);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace kiln::cli
