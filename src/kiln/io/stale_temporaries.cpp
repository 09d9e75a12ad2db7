#include "kiln/io/stale_temporaries.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <fstream>
#include <sstream>
#include <system_error>

namespace kiln::io {

namespace fs = std::filesystem;

namespace {

// The suffixes (and the one whole-name prefix) after which a writer puts its process id.
constexpr std::string_view kPidMarkers[] = {".tmp.", ".partial.", ".unpacked."};
constexpr std::string_view kPartialPrefix = "partial.";

std::optional<pid_t> parse_pid(std::string_view digits) {
  if (digits.empty() || digits.size() > 10) return std::nullopt;
  long long v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size() || v <= 0 || v > 0x7fffffff) return std::nullopt;
  return static_cast<pid_t>(v);
}

// When the process `pid` started, from /proc (Linux); nullopt when it cannot be told.
std::optional<std::chrono::system_clock::time_point> process_start(pid_t pid) {
  std::ifstream stat_file(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(stat_file)), {});
  const auto close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  // Fields from the state (3rd) on; starttime is the 22nd, in clock ticks since boot.
  unsigned long long start_ticks = 0;
  for (int i = 3; i <= 22 && fields >> field; ++i)
    if (i == 22) start_ticks = std::stoull(field);
  if (start_ticks == 0) return std::nullopt;
  std::ifstream proc_stat("/proc/stat");
  std::string key;
  long long boot_time = 0;
  while (proc_stat >> key) {
    if (key == "btime") {
      proc_stat >> boot_time;
      break;
    }
  }
  const long ticks_per_second = ::sysconf(_SC_CLK_TCK);
  if (boot_time <= 0 || ticks_per_second <= 0) return std::nullopt;
  const double seconds = static_cast<double>(boot_time) + static_cast<double>(start_ticks) / ticks_per_second;
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(seconds)));
}

std::uintmax_t size_of(const fs::path& p) {
  std::error_code ec;
  if (fs::is_regular_file(fs::symlink_status(p, ec))) return fs::file_size(p, ec);
  std::uintmax_t total = 0;
  if (!fs::is_directory(fs::symlink_status(p, ec))) return 0;
  for (auto it = fs::recursive_directory_iterator(p, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::error_code e2;
    if (it->is_regular_file(e2)) total += it->file_size(e2);
  }
  return total;
}

}  // namespace

std::optional<pid_t> temporary_owner(std::string_view name) {
  for (std::string_view marker : kPidMarkers) {
    const auto at = name.rfind(marker);
    if (at != std::string_view::npos && at > 0) return parse_pid(name.substr(at + marker.size()));
  }
  if (name.starts_with(kPartialPrefix)) return parse_pid(name.substr(kPartialPrefix.size()));
  return std::nullopt;
}

bool temporary_owner_gone(pid_t pid, fs::file_time_type written) {
  if (pid == ::getpid()) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;  // (EPERM: someone else's live process)
  auto started = process_start(pid);
  if (!started) return false;
  // A process that started after the file was last written cannot have written it. One second of
  // slack for the granularity of the start time (clock ticks) and of file times.
  const auto written_at = std::chrono::file_clock::to_sys(written);
  return *started > written_at + std::chrono::seconds(1);
}

std::vector<RemovedTemporary> remove_stale_temporaries(const fs::path& dir) {
  std::vector<RemovedTemporary> removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  std::vector<fs::path> stale;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto pid = temporary_owner(it->path().filename().string());
    if (!pid) continue;
    std::error_code e2;
    const auto written = fs::last_write_time(it->path(), e2);
    if (!e2 && temporary_owner_gone(*pid, written)) stale.push_back(it->path());
  }
  for (const fs::path& p : stale) {
    const std::uintmax_t bytes = size_of(p);
    std::error_code e2;
    fs::remove_all(p, e2);
    if (!e2) removed.push_back({p, bytes});
  }
  return removed;
}

std::string describe_removed(const std::vector<RemovedTemporary>& removed) {
  if (removed.empty()) return "";
  std::uintmax_t bytes = 0;
  std::string names;
  for (const auto& r : removed) {
    bytes += r.bytes;
    names += (names.empty() ? "" : ", ") + r.path.string();
  }
  return fmt::format("removed {} stale temporar{} left by an interrupted run ({:.1f} MB): {}", removed.size(),
                     removed.size() == 1 ? "y" : "ies", static_cast<double>(bytes) / 1e6, names);
}

}  // namespace kiln::io
