#include "kiln/train/rank_agent.h"

#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "kiln/dist/launch_environment.h"
#include "kiln/io/atomic_file.h"
#include "kiln/runtime/error.h"

namespace kiln::train {

namespace {

volatile std::sig_atomic_t g_child = 0;
volatile std::sig_atomic_t g_stop_requested = 0;

// The launcher asks the job to stop (mpirun forwards SIGTERM to every rank when one fails, Slurm
// when a step is cancelled): pass it to the rank, and remember that its end was asked for.
void forward_signal(int sig) {
  g_stop_requested = 1;
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), sig);
}

}  // namespace

std::string describe(const RankExit& e) {
  if (!e.signaled) return fmt::format("rank {} exited with code {}", e.rank, e.value);
  const char* name = sigabbrev_np(e.value);
  return fmt::format("rank {} was killed by signal {}{}", e.rank, e.value,
                     name != nullptr ? fmt::format(" (SIG{})", name) : std::string());
}

std::filesystem::path rank_exit_file(const std::filesystem::path& dir, int rank) {
  return dir / fmt::format("rank_{}.exit", rank);
}

void write_rank_exit(const std::filesystem::path& dir, const RankExit& e) {
  io::AtomicFile out(rank_exit_file(dir, e.rank));
  out.write(fmt::format("{} {} {} {} {}\n", e.rank, e.unix_ns, e.signaled ? "signal" : "code", e.value,
                        e.after_stop_request ? 1 : 0));
  out.commit();
}

std::optional<RankExit> read_rank_exit(const std::filesystem::path& file) {
  std::ifstream in(file);
  RankExit e;
  std::string how;
  int after = 0;
  if (!(in >> e.rank >> e.unix_ns >> how >> e.value >> after)) return std::nullopt;
  e.signaled = how == "signal";
  e.after_stop_request = after != 0;
  return e;
}

int run_rank_agent(const std::vector<std::string>& command) {
  KILN_CHECK(!command.empty(), "kiln launch-rank: no command after '--'");
  const char* dir = std::getenv("KILN_HEARTBEAT_DIR");
  KILN_CHECK(dir != nullptr && *dir != '\0',
             "kiln launch-rank: KILN_HEARTBEAT_DIR is not set (launch-rank is started by kiln launch, not by hand)");
  const auto position = dist::launch_position_from_environment();
  KILN_CHECK(position.has_value(),
             "kiln launch-rank: no rank in the environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or a Slurm "
             "step's SLURM_PROCID): launch-rank runs under mpirun or srun");
  const pid_t agent = ::getpid();
  // If the launcher dies without a word (SIGKILL), this agent hears it and stops its rank.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);

  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) ::sigaction(sig, &sa, nullptr);

  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t child = ::fork();
  KILN_CHECK(child >= 0, "kiln launch-rank: fork failed: {}", std::strerror(errno));
  if (child == 0) {
    // The rank dies with its agent (no orphan rank holding a GPU after the job was stopped).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != agent) ::_exit(1);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) ::sigaction(sig, &dfl, nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "kiln launch-rank: cannot run '%s': %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  g_child = child;
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) KILN_FAIL("kiln launch-rank: waitpid failed: {}", std::strerror(errno));
  }
  RankExit e;
  e.rank = position->rank;
  e.unix_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  e.signaled = WIFSIGNALED(status);
  e.value = e.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
  e.after_stop_request = g_stop_requested != 0;
  try {
    write_rank_exit(dir, e);
  } catch (const std::exception& err) {  // the record is for the log; the exit status matters more
    std::fprintf(stderr, "kiln launch-rank: %s\n", err.what());
  }
  if (e.signaled) {
    // End as the rank ended: the launcher reports (and reacts to) the same signal.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(e.value, &dfl, nullptr);
    ::raise(e.value);
    return 128 + e.value;  // a signal that does not end a process (SIGCHLD ...)
  }
  return e.value;
}

}  // namespace kiln::train
