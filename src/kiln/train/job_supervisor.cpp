#include "kiln/train/job_supervisor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

#include "kiln/runtime/error.h"
#include "kiln/train/heartbeat.h"
#include "kiln/train/rank_agent.h"

namespace kiln::train {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

// SIGINT / SIGTERM handlers for the supervision's lifetime (the previous ones back after).
class StopSignalScope {
 public:
  StopSignalScope() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignalScope() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Starts argv as the leader of a new process group (the whole job: launcher, agents, ranks, as
// far as they stay in it) with KILN_HEARTBEAT_DIR set.
pid_t start_job(const std::vector<std::string>& argv, const fs::path& attempt_dir) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  KILN_CHECK(pid >= 0, "kiln launch: fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::setenv("KILN_HEARTBEAT_DIR", attempt_dir.c_str(), 1);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGINT, &dfl, nullptr);
    ::sigaction(SIGTERM, &dfl, nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "kiln launch: cannot run '%s': %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no window in which a signal to the group misses the child
  return pid;
}

// SIGTERM to the job's process group, SIGKILL after `grace` seconds; returns the leader's status.
int stop_job(pid_t pid, double grace) {
  ::killpg(pid, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::duration<double>(grace);
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (Clock::now() >= deadline) {
      ::killpg(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::killpg(pid, SIGKILL);  // whatever of the group outlived its leader
  return status;
}

std::string status_text(int status) {
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return fmt::format("was killed by signal {}{}", WTERMSIG(status),
                       name != nullptr ? fmt::format(" (SIG{})", name) : std::string());
  }
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

int exit_code_of(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

// What one rank's heartbeat file last looked like, and since when.
struct BeatWatch {
  std::string content;
  timespec mtime{};
  Clock::time_point changed;
  bool seen = false;  // a first beat came
  bool done = false;  // the rank finished its iterations
  std::int64_t iteration = -1;
};

// Reads the heartbeat files; returns why the job counts as hung, or nullopt. Once one rank is
// silent too long, the others usually are too (they wait for it in a collective): the rank named
// is the one furthest behind (lowest iteration, then the oldest beat), and the others are listed.
std::optional<std::string> check_heartbeats(const SupervisorOptions& o, const fs::path& dir,
                                            std::vector<BeatWatch>& watch, Clock::time_point started) {
  const auto now = Clock::now();
  bool hung = false;
  for (int r = 0; r < o.world_size; ++r) {
    BeatWatch& w = watch[static_cast<std::size_t>(r)];
    if (w.done) continue;
    const fs::path file = dir / Heartbeat::file_name(r);
    struct stat st {};
    if (::stat(file.c_str(), &st) == 0) {
      std::ifstream in(file);
      std::string content;
      std::getline(in, content);
      if (!content.empty() &&
          (content != w.content || st.st_mtim.tv_sec != w.mtime.tv_sec || st.st_mtim.tv_nsec != w.mtime.tv_nsec)) {
        w.content = content;
        w.mtime = st.st_mtim;
        w.changed = now;
        w.seen = true;
        w.iteration = Heartbeat::read_iteration(file);
        if (content.find(Heartbeat::kDone) != std::string::npos) w.done = true;
      }
    }
    if (w.done) continue;
    if (w.seen && o.heartbeat_timeout > 0 && seconds_between(w.changed, now) > o.heartbeat_timeout) hung = true;
    if (!w.seen && o.startup_timeout > 0 && seconds_between(started, now) > o.startup_timeout)
      return fmt::format(
          "rank {} hung before training: no first heartbeat within {} s of the start (--startup-timeout)", r,
          o.startup_timeout);
  }
  if (!hung) return std::nullopt;
  int behind = -1;
  for (int r = 0; r < o.world_size; ++r) {
    const BeatWatch& w = watch[static_cast<std::size_t>(r)];
    if (w.done || !w.seen) continue;
    const BeatWatch* b = behind < 0 ? nullptr : &watch[static_cast<std::size_t>(behind)];
    if (!b || w.iteration < b->iteration || (w.iteration == b->iteration && w.changed < b->changed)) behind = r;
  }
  const BeatWatch& b = watch[static_cast<std::size_t>(behind)];
  std::vector<std::string> others;
  for (int r = 0; r < o.world_size; ++r) {
    const BeatWatch& w = watch[static_cast<std::size_t>(r)];
    if (r == behind) continue;
    others.push_back(w.done   ? fmt::format("rank {} done", r)
                     : w.seen ? fmt::format("rank {} at iteration {}", r, w.iteration)
                              : fmt::format("rank {} not started", r));
  }
  return fmt::format(
      "rank {} hung: no heartbeat for {:.1f} s (--heartbeat-timeout {}); its last beat was at the start of iteration "
      "{}{}",
      behind, seconds_between(b.changed, now), o.heartbeat_timeout, b.iteration,
      others.empty() ? std::string() : fmt::format(" (the others: {})", fmt::join(others, ", ")));
}

// Why a job that ended with `status` failed, from its rank agents' records: the first rank killed
// by a signal nobody asked for, else the first that exited non-zero on its own; the rest follow.
std::string failure_reason(const SupervisorOptions& o, const fs::path& dir, int status, const std::string& launcher) {
  std::vector<RankExit> failed;
  for (int r = 0; r < o.world_size; ++r)
    if (auto e = read_rank_exit(rank_exit_file(dir, r)); e && e->failed()) failed.push_back(*e);
  auto rank_order = [](const RankExit& e) {
    // Causes first (not after a stop request), signals before exit codes, then by time.
    return std::tuple(e.after_stop_request, !e.signaled, e.unix_ns);
  };
  std::sort(failed.begin(), failed.end(),
            [&](const RankExit& a, const RankExit& b) { return rank_order(a) < rank_order(b); });
  if (failed.empty() || failed.front().after_stop_request)
    return fmt::format("{} {} and no rank recorded a failure of its own", launcher, status_text(status));
  std::string reason = describe(failed.front());
  std::vector<std::string> others;
  for (std::size_t i = 1; i < failed.size(); ++i)
    others.push_back(describe(failed[i]) + (failed[i].after_stop_request ? " after the launcher stopped it" : ""));
  if (!others.empty()) reason += fmt::format(" (then: {})", fmt::join(others, "; "));
  return reason;
}

}  // namespace

SupervisorResult supervise_job(const SupervisorOptions& o) {
  KILN_CHECK(o.command_for_attempt, "supervise_job: no command");
  auto log = [&](const std::string& line) {
    if (o.log) o.log(line);
  };
  StopSignalScope signals;
  SupervisorResult result;
  const bool watch_beats = o.heartbeat_timeout > 0 || o.startup_timeout > 0;
  const double shortest =
      std::min(o.heartbeat_timeout > 0 ? o.heartbeat_timeout : 1e9, o.startup_timeout > 0 ? o.startup_timeout : 1e9);
  const auto poll = std::chrono::duration<double>(std::clamp(shortest / 10, 0.05, 1.0));
  for (int attempt = 0;; ++attempt) {
    const fs::path dir = o.heartbeat_root / fmt::format("attempt_{}", attempt);
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::create_directories(dir, ec);
    KILN_CHECK(!ec, "kiln launch: cannot create the heartbeat folder {}: {}", dir.string(), ec.message());
    const std::vector<std::string> argv = o.command_for_attempt(attempt);
    const auto started = Clock::now();
    const pid_t pid = start_job(argv, dir);
    std::vector<BeatWatch> watch(static_cast<std::size_t>(o.world_size));
    int status = 0;
    std::string reason;
    for (;;) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        ::killpg(pid, SIGKILL);  // stragglers of the group, if any
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) reason = failure_reason(o, dir, status, argv[0]);
        break;
      }
      if (g_stop_signal != 0) {
        const int sig = g_stop_signal;
        log(fmt::format("kiln launch: {} received: stopping the job (no restart)",
                        sig == SIGINT ? "SIGINT" : "SIGTERM"));
        stop_job(pid, o.kill_grace);
        result.exit_code = 128 + sig;
        result.reason = fmt::format("stopped by {}", sig == SIGINT ? "SIGINT" : "SIGTERM");
        return result;
      }
      if (watch_beats) {
        if (auto hang = check_heartbeats(o, dir, watch, started)) {
          log(fmt::format("kiln launch: {}; stopping the whole job", *hang));
          stop_job(pid, o.kill_grace);
          reason = *hang;
          status = -1;
          break;
        }
      }
      std::this_thread::sleep_for(poll);
    }
    if (reason.empty()) {
      result.exit_code = 0;
      return result;
    }
    log(fmt::format("kiln launch: attempt {} failed: {}", attempt + 1, reason));
    result.reason = reason;
    if (attempt >= o.max_restarts) {
      result.exit_code = status > 0 && exit_code_of(status) != 0 ? exit_code_of(status) : 1;
      return result;
    }
    ++result.restarts;
  }
}

}  // namespace kiln::train
