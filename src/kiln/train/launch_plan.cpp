#include "kiln/train/launch_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "kiln/runtime/error.h"
#include "kiln/train/checkpoint_store.h"

namespace kiln::train {

namespace {

std::optional<int> leading_int(const char* text) {
  if (text == nullptr) return std::nullopt;
  const std::string_view s(text);
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end == s.data() || value < 1) return std::nullopt;
  return value;
}

bool is_flag(const std::string& arg, std::string_view flag) {
  return arg == flag || (arg.size() > flag.size() && arg.compare(0, flag.size(), flag) == 0 && arg[flag.size()] == '=');
}

}  // namespace

std::optional<SlurmAllocation> slurm_allocation_from(const std::function<const char*(const char*)>& lookup) {
  const char* job = lookup("SLURM_JOB_ID");
  if (job == nullptr || *job == '\0') return std::nullopt;
  SlurmAllocation a;
  a.job_id = job;
  a.nnodes = leading_int(lookup("SLURM_JOB_NUM_NODES")).value_or(leading_int(lookup("SLURM_NNODES")).value_or(1));
  a.ntasks_per_node = leading_int(lookup("SLURM_NTASKS_PER_NODE"));
  return a;
}

std::optional<SlurmAllocation> slurm_allocation_from_environment() {
  return slurm_allocation_from([](const char* name) -> const char* { return std::getenv(name); });
}

LaunchPlan plan_launch(const LaunchOptions& o, const std::optional<SlurmAllocation>& slurm) {
  KILN_CHECK(!o.command.empty(),
             "no command to run: put it after '--', e.g. kiln launch --nproc-per-node 2 -- kiln "
             "pretrain-gpt ...");
  KILN_CHECK(o.launcher == "auto" || o.launcher == "mpirun" || o.launcher == "srun",
             "--launcher: '{}' is not one of auto, mpirun, srun", o.launcher);
  KILN_CHECK(o.max_restarts >= 0, "--max-restarts: must be a whole number >= 0, got {}", o.max_restarts);
  KILN_CHECK(o.heartbeat_timeout >= 0 && std::isfinite(o.heartbeat_timeout),
             "--heartbeat-timeout: must be a number of seconds >= 0 (0: no hang detection), got {}",
             o.heartbeat_timeout);
  KILN_CHECK(o.startup_timeout >= 0 && std::isfinite(o.startup_timeout),
             "--startup-timeout: must be a number of seconds >= 0 (0: no limit), got {}", o.startup_timeout);
  KILN_CHECK(o.node_rank >= 0, "--node-rank: must be >= 0, got {}", o.node_rank);
  KILN_CHECK(o.master_port >= 0 && o.master_port <= 65535, "--master-port: {} is not a port (0..65535)", o.master_port);

  LaunchPlan p;
  p.launcher = o.launcher == "auto" ? (slurm ? "srun" : "mpirun") : o.launcher;
  KILN_CHECK(p.launcher != "srun" || slurm,
             "--launcher srun: not inside a Slurm allocation (no SLURM_JOB_ID): run kiln launch from sbatch or salloc, "
             "or use --launcher mpirun");

  if (o.nproc_per_node != 0) {
    KILN_CHECK(o.nproc_per_node >= 1, "--nproc-per-node: must be >= 1 (one process per GPU), got {}", o.nproc_per_node);
    p.nproc_per_node = o.nproc_per_node;
  } else {
    KILN_CHECK(slurm && slurm->ntasks_per_node,
               "--nproc-per-node: missing (the processes per node, one per GPU); inside a Slurm allocation made with "
               "--ntasks-per-node it defaults to that");
    p.nproc_per_node = *slurm->ntasks_per_node;
  }
  if (o.nnodes != 0) {
    KILN_CHECK(o.nnodes >= 1, "--nnodes: must be >= 1, got {}", o.nnodes);
    p.nnodes = o.nnodes;
  } else {
    p.nnodes = slurm ? slurm->nnodes : (o.hosts.empty() ? 1 : static_cast<int>(o.hosts.size()));
  }
  // Under MPI one launcher starts the ranks of every node (mpirun through its daemons, srun through
  // Slurm's), unlike torchrun's one agent per node: a second kiln launch would start a second job.
  KILN_CHECK(o.node_rank == 0,
             "--node-rank {}: kiln launch starts the ranks of every node from one place (mpirun or srun); run it "
             "once, on the first node (--node-rank 0), not once per node",
             o.node_rank);
  if (slurm)
    KILN_CHECK(p.nnodes <= slurm->nnodes, "--nnodes {}: the Slurm allocation {} has {} node(s)", p.nnodes,
               slurm->job_id, slurm->nnodes);
  KILN_CHECK(o.hosts.empty() || o.hostfile.empty(), "--hosts and --hostfile: give one of them, not both");
  KILN_CHECK(o.hosts.empty() || static_cast<int>(o.hosts.size()) == p.nnodes,
             "--hosts names {} node(s) ({}), --nnodes is {}", o.hosts.size(), fmt::join(o.hosts, ","), p.nnodes);
  KILN_CHECK(p.nnodes == 1 || slurm || !o.hosts.empty() || !o.hostfile.empty(),
             "--nnodes {} outside a Slurm allocation: name the nodes with --hosts host1,host2,... or --hostfile FILE "
             "(mpirun starts every rank from this node)",
             p.nnodes);
  KILN_CHECK(p.nnodes == 1 || !o.heartbeat_dir.empty() || o.heartbeat_timeout == 0,
             "--nnodes {}: give --heartbeat-dir a folder every node sees (a shared file system), or turn hang "
             "detection off with --heartbeat-timeout 0",
             p.nnodes);
  KILN_CHECK(o.master_addr.empty() || o.hosts.empty() ||
                 std::find(o.hosts.begin(), o.hosts.end(), o.master_addr) != o.hosts.end(),
             "--master-addr {} is not one of --hosts {}", o.master_addr, fmt::join(o.hosts, ","));

  const std::string np = std::to_string(p.world_size());
  if (p.launcher == "mpirun") {
    p.launcher_argv = {"mpirun", "-np", np};
    if (!o.hosts.empty()) {
      // Rank 0 runs on the first host: --master-addr's node when it is named.
      std::vector<std::string> hosts = o.hosts;
      if (!o.master_addr.empty())
        std::stable_partition(hosts.begin(), hosts.end(), [&](const std::string& h) { return h == o.master_addr; });
      std::vector<std::string> slots;
      for (const auto& h : hosts) slots.push_back(fmt::format("{}:{}", h, p.nproc_per_node));
      p.launcher_argv.insert(p.launcher_argv.end(), {"--host", fmt::format("{}", fmt::join(slots, ","))});
    } else if (!o.hostfile.empty()) {
      p.launcher_argv.insert(p.launcher_argv.end(), {"--hostfile", o.hostfile});
    }
    if (p.nnodes > 1)  // nproc_per_node on each node, whatever slot counts the nodes advertise
      p.launcher_argv.insert(p.launcher_argv.end(), {"--map-by", fmt::format("ppr:{}:node", p.nproc_per_node)});
    // Local ranks inherit mpirun's environment; ranks on other nodes get these only when named.
    p.launcher_argv.insert(p.launcher_argv.end(), {"-x", "KILN_HEARTBEAT_DIR"});
    if (!o.master_addr.empty()) p.launcher_argv.insert(p.launcher_argv.end(), {"-x", "MASTER_ADDR"});
    if (o.master_port != 0) p.launcher_argv.insert(p.launcher_argv.end(), {"-x", "MASTER_PORT"});
  } else {
    // srun passes the whole environment (--export=ALL is its default); --kill-on-bad-exit ends the
    // step when one task fails, as mpirun does.
    p.launcher_argv = {"srun", fmt::format("--nodes={}", p.nnodes), fmt::format("--ntasks={}", np),
                       fmt::format("--ntasks-per-node={}", p.nproc_per_node), "--kill-on-bad-exit=1"};
    KILN_CHECK(o.hosts.empty() && o.hostfile.empty(),
               "--hosts / --hostfile: with srun the nodes are the Slurm allocation's (use --launcher mpirun to name "
               "them)");
  }
  p.launcher_argv.insert(p.launcher_argv.end(), o.launcher_args.begin(), o.launcher_args.end());
  p.command = o.command;

  if (auto save = flag_value(o.command, "--save")) {
    p.save_dir = *save;
  } else {
    p.notes.push_back(
        "the command has no --save: a restart starts it from the beginning (give --save and --save-interval to "
        "resume from checkpoints)");
  }
  if (o.master_port != 0 || !o.master_addr.empty())
    p.notes.push_back(
        "--master-addr/--master-port are exported to the ranks as MASTER_ADDR/MASTER_PORT; Kiln's ranks meet through "
        "MPI (the NCCL id too) and need no port");
  return p;
}

std::vector<std::string> job_argv(const LaunchPlan& plan, const std::string& self_exe,
                                  const std::vector<std::string>& command) {
  std::vector<std::string> argv = plan.launcher_argv;
  argv.insert(argv.end(), {self_exe, "launch-rank", "--"});
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

std::optional<std::string> flag_value(const std::vector<std::string>& command, std::string_view flag) {
  std::optional<std::string> value;
  for (std::size_t i = 0; i < command.size(); ++i) {
    if (command[i] == flag && i + 1 < command.size())
      value = command[i + 1];
    else if (is_flag(command[i], flag) && command[i] != flag)
      value = command[i].substr(flag.size() + 1);
  }
  return value;
}

std::vector<std::string> restart_command(const std::vector<std::string>& command,
                                         const std::filesystem::path& save_dir) {
  if (save_dir.empty() || !newest_checkpoint_folder(save_dir)) return command;
  std::vector<std::string> out;
  for (std::size_t i = 0; i < command.size(); ++i) {
    const std::string& a = command[i];
    if (a == "--load") {
      ++i;  // and its value
      continue;
    }
    if (is_flag(a, "--load") || a == "--finetune" || a == "--no-load-optim") continue;
    out.push_back(a);
  }
  out.insert(out.end(), {"--load", save_dir.string()});
  return out;
}

std::optional<std::filesystem::path> newest_checkpoint_folder(const std::filesystem::path& save_dir) {
  std::error_code ec;
  std::optional<std::int64_t> newest;
  for (const auto& entry : std::filesystem::directory_iterator(save_dir, ec)) {
    const auto it = parse_iteration_dir(entry.path().filename().string());
    if (it && std::filesystem::exists(entry.path() / CheckpointStore::kManifest, ec) && (!newest || *it > *newest))
      newest = it;
  }
  if (!newest) return std::nullopt;
  return save_dir / iteration_dir_name(*newest);
}

std::string shell_text(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    if (!out.empty()) out += ' ';
    const bool plain = !a.empty() && a.find_first_of(" \t\n'\"\\$`;&|<>()*?") == std::string::npos;
    if (plain) {
      out += a;
    } else {
      out += '\'';
      for (char c : a) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
      out += '\'';
    }
  }
  return out;
}

}  // namespace kiln::train
