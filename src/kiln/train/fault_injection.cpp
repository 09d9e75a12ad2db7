#include "kiln/train/fault_injection.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "kiln/dist/launch_environment.h"
#include "kiln/runtime/error.h"

namespace kiln::train {

namespace detail {
std::atomic<bool> g_faults_armed{false};
}

namespace {

struct PlannedFault {
  FaultKind kind;
  std::int64_t at;
  bool fired = false;
};

constexpr FaultKind kKinds[] = {FaultKind::NanLoss,
                                FaultKind::Spike,
                                FaultKind::Crash,
                                FaultKind::Hang,
                                FaultKind::KillInSave,
                                FaultKind::DiskFullInSave,
                                FaultKind::CorruptCheckpoint};

std::mutex g_mutex;  // the save thread and the training thread both ask
std::vector<PlannedFault> g_plan;
std::once_flag g_from_environment;
std::string g_once_dir;  // KILN_FAULT_ONCE: where the markers of fired faults live ("" : none)

// KILN_FAULT_ONCE: true when this process is the first (across restarts) to claim the fault.
bool claim_marker(FaultKind kind, std::int64_t at) {
  if (g_once_dir.empty()) return true;
  const std::string marker = fmt::format("{}/{}@{}", g_once_dir, fault_name(kind), at);
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;  // fired before (or the folder is unusable: then never)
  ::close(fd);
  return true;
}

std::vector<PlannedFault> parse_plan(std::string_view spec) {
  std::vector<PlannedFault> plan;
  while (!spec.empty()) {
    const auto comma = spec.find(',');
    const std::string_view entry = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    if (entry.empty()) continue;
    const auto at = entry.find('@');
    KILN_CHECK(at != std::string_view::npos, "KILN_FAULT: '{}' has no '@<number>' (expected e.g. nan_loss@12)", entry);
    const std::string_view name = entry.substr(0, at), number = entry.substr(at + 1);
    std::optional<FaultKind> kind;
    for (FaultKind k : kKinds)
      if (name == fault_name(k)) kind = k;
    KILN_CHECK(kind,
               "KILN_FAULT: unknown fault '{}' in '{}'; known: nan_loss, spike, crash, hang, kill_in_save, "
               "disk_full_in_save, corrupt_checkpoint",
               name, entry);
    std::int64_t value = 0;
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
    KILN_CHECK(ec == std::errc() && end == number.data() + number.size() && value >= 1,
               "KILN_FAULT: '{}': '{}' is not a whole number >= 1", entry, number);
    plan.push_back({*kind, value});
  }
  return plan;
}

void install(std::vector<PlannedFault> plan) {
  std::lock_guard lock(g_mutex);
  g_plan = std::move(plan);
  detail::g_faults_armed.store(!g_plan.empty(), std::memory_order_relaxed);
}

}  // namespace

const char* fault_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::NanLoss: return "nan_loss";
    case FaultKind::Spike: return "spike";
    case FaultKind::Crash: return "crash";
    case FaultKind::Hang: return "hang";
    case FaultKind::KillInSave: return "kill_in_save";
    case FaultKind::DiskFullInSave: return "disk_full_in_save";
    case FaultKind::CorruptCheckpoint: return "corrupt_checkpoint";
  }
  return "?";
}

void arm_faults_from_environment() {
  std::call_once(g_from_environment, [] {
    const char* spec = std::getenv("KILN_FAULT");
    if (!spec || !*spec) return;
    auto plan = parse_plan(spec);  // parsed on every rank, so a malformed value fails everywhere
    if (const char* only = std::getenv("KILN_FAULT_RANK"); only && *only) {
      int rank = -1;
      const std::string_view text(only);
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), rank);
      KILN_CHECK(ec == std::errc() && end == text.data() + text.size() && rank >= 0,
                 "KILN_FAULT_RANK: '{}' is not a rank (a whole number >= 0)", text);
      const auto position = dist::launch_position_from_environment();
      if ((position ? position->rank : 0) != rank) return;
    }
    if (const char* once = std::getenv("KILN_FAULT_ONCE"); once && *once) g_once_dir = once;
    install(std::move(plan));
  });
}

void set_fault_plan_for_testing(const std::string& spec) {
  std::call_once(g_from_environment, [] {});  // the test's plan is not replaced by the environment's later
  install(parse_plan(spec));
}

bool detail::fault_fires(FaultKind kind, std::int64_t at) {
  std::lock_guard lock(g_mutex);
  for (PlannedFault& f : g_plan) {
    if (f.kind == kind && f.at == at && !f.fired) {
      f.fired = true;
      return claim_marker(kind, at);
    }
  }
  return false;
}

std::optional<double> loss_fault_factor(std::int64_t step) {
  if (!detail::g_faults_armed.load(std::memory_order_relaxed)) return std::nullopt;
  if (fault_fires(FaultKind::NanLoss, step)) {
    fmt::print("fault injection: the loss of step {} is NaN (KILN_FAULT nan_loss@{})\n", step, step);
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (fault_fires(FaultKind::Spike, step)) {
    fmt::print("fault injection: the loss of step {} is multiplied by {} (KILN_FAULT spike@{})\n", step, kSpikeFactor,
               step);
    return kSpikeFactor;
  }
  return std::nullopt;
}

void crash_if_planned(std::int64_t step) {
  if (!detail::g_faults_armed.load(std::memory_order_relaxed)) return;
  if (fault_fires(FaultKind::Crash, step)) {
    fmt::print("fault injection: SIGKILL before step {} (KILN_FAULT crash@{})\n", step, step);
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
  if (fault_fires(FaultKind::Hang, step)) {
    fmt::print("fault injection: hanging before step {} (KILN_FAULT hang@{})\n", step, step);
    std::fflush(stdout);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));  // until a signal ends the process
  }
}

}  // namespace kiln::train
