#include "kiln/io/subprocess.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "kiln/runtime/error.h"

namespace kiln::io {

ProcessResult run_process(const std::vector<std::string>& argv, const std::filesystem::path& working_dir) {
  KILN_CHECK(!argv.empty(), "run_process: no program given");
  int pipe_fds[2];
  KILN_CHECK(::pipe2(pipe_fds, O_CLOEXEC) == 0, "cannot create a pipe to run '{}': {}", argv[0], std::strerror(errno));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string dir = working_dir.string();

  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    KILN_FAIL("cannot start '{}': fork failed: {}", argv[0], std::strerror(err));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    ::dup2(pipe_fds[1], STDERR_FILENO);
    if (!dir.empty() && ::chdir(dir.c_str()) != 0) ::_exit(126);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  ProcessResult result;
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(pipe_fds[0], buffer, sizeof(buffer));
    if (n > 0) {
      result.output.append(buffer, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(pipe_fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    KILN_CHECK(errno == EINTR, "waiting for '{}' failed: {}", argv[0], std::strerror(errno));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (result.exit_code == 127 && result.output.empty()) {
    KILN_FAIL("cannot start '{}': not found in PATH", argv[0]);
  }
  if (result.exit_code == 126 && result.output.empty() && !dir.empty()) {
    KILN_FAIL("cannot start '{}': cannot enter folder '{}'", argv[0], dir);
  }
  return result;
}

bool program_in_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    // An empty PATH entry means the current folder.
    const std::filesystem::path folder = dir.empty() ? std::filesystem::current_path() : std::filesystem::path(dir);
    if (::access((folder / program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

}  // namespace kiln::io
