#include "kiln/train/heartbeat.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "kiln/dist/launch_environment.h"
#include "kiln/runtime/error.h"

namespace kiln::train {

Heartbeat Heartbeat::from_environment() {
  const char* dir = std::getenv("KILN_HEARTBEAT_DIR");
  if (dir == nullptr || *dir == '\0') return {};
  const auto position = dist::launch_position_from_environment();
  return Heartbeat(dir, position ? position->rank : 0);
}

Heartbeat::Heartbeat(const std::filesystem::path& dir, int rank) {
  const std::filesystem::path file = dir / file_name(rank);
  fd_ = ::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  KILN_CHECK(fd_ >= 0, "KILN_HEARTBEAT_DIR: cannot open the heartbeat file {}: {}", file.string(),
             std::strerror(errno));
}

Heartbeat::Heartbeat(Heartbeat&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

Heartbeat& Heartbeat::operator=(Heartbeat&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

Heartbeat::~Heartbeat() {
  if (fd_ >= 0) ::close(fd_);
}

void Heartbeat::beat(std::int64_t iteration) {
  if (fd_ < 0) return;
  // Fixed width, so each beat overwrites the last in place (no truncation, one call). A failed
  // write is not an error of the training: the supervisor will see a stale file and say so.
  char text[24];
  const auto n = fmt::format_to_n(text, sizeof(text), "{:>20}\n", iteration).size;
  [[maybe_unused]] const auto written = ::pwrite(fd_, text, n, 0);
}

void Heartbeat::finish() {
  if (fd_ < 0) return;
  char text[24];
  const auto n = fmt::format_to_n(text, sizeof(text), "{:>20}\n", kDone).size;
  [[maybe_unused]] const auto written = ::pwrite(fd_, text, n, 0);
}

std::string Heartbeat::file_name(int rank) { return fmt::format("rank_{}", rank); }

std::int64_t Heartbeat::read_iteration(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::int64_t iteration = -1;
  if (!(in >> iteration)) return -1;
  return iteration;
}

}  // namespace kiln::train
