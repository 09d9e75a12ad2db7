#include "kiln/hpc/md/trajectory_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "kiln/runtime/error.h"

namespace kiln::md {

TrajectoryOutput::TrajectoryOutput(std::filesystem::path path, std::optional<std::int64_t> resume_step,
                                   KeepFunction bytes_to_keep)
    : path_(std::move(path)) {
  if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path());
  std::size_t keep = 0;
  if (resume_step && std::filesystem::exists(path_)) {
    std::ifstream in(path_, std::ios::binary);
    KILN_CHECK(in.good(), "cannot read the trajectory {} to continue it", path_.string());
    std::stringstream contents;
    contents << in.rdbuf();
    keep = bytes_to_keep(contents.str(), *resume_step);
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  KILN_CHECK(fd_ >= 0, "cannot open the trajectory {}: {}", path_.string(), std::strerror(errno));
  if (::ftruncate(fd_, static_cast<off_t>(keep)) != 0) {
    const int err = errno;
    ::close(fd_);
    KILN_FAIL("cannot cut the trajectory {} back to {} bytes: {}", path_.string(), keep, std::strerror(err));
  }
}

TrajectoryOutput::~TrajectoryOutput() {
  if (fd_ >= 0) {
    ::fsync(fd_);
    ::close(fd_);
  }
}

void TrajectoryOutput::append(std::string_view frame) {
  std::size_t done = 0;
  while (done < frame.size()) {
    const ssize_t n = ::write(fd_, frame.data() + done, frame.size() - done);
    if (n < 0 && errno == EINTR) continue;
    KILN_CHECK(n > 0, "cannot write the trajectory {}: {}", path_.string(), std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
}

void TrajectoryOutput::sync() {
  KILN_CHECK(::fsync(fd_) == 0, "cannot write the trajectory {}: {}", path_.string(), std::strerror(errno));
}

}  // namespace kiln::md
