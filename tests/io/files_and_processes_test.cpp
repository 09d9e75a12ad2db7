// AtomicFile, file digests and subprocesses: the plumbing under the dataset download.
#include <gtest/gtest.h>

#include "io_test_util.h"
#include "kiln/io/atomic_file.h"
#include "kiln/io/file_digest.h"
#include "kiln/io/subprocess.h"

namespace kiln::io {
namespace files_and_processes_test {

TEST(AtomicFile, TargetAppearsOnlyOnCommit) {
  auto dir = testing::scratch_dir();
  auto target = dir / "sub" / "out.bin";
  {
    AtomicFile file(target);
    file.write("hello ");
    file.write("world");
    EXPECT_FALSE(std::filesystem::exists(target));
    EXPECT_TRUE(std::filesystem::exists(file.temp_path()));
    file.commit();
  }
  EXPECT_EQ(testing::read_all(target), "hello world");
  std::filesystem::path temp;
  {
    AtomicFile abandoned(target);
    abandoned.write("half");
    temp = abandoned.temp_path();
  }  // destroyed without commit, as when an exception unwinds
  EXPECT_EQ(testing::read_all(target), "hello world");
  EXPECT_FALSE(std::filesystem::exists(temp));
}

TEST(FileDigest, MatchesPublishedVectors) {
  EXPECT_EQ(digest_hex("abc", DigestKind::MD5), "900150983cd24fb0d6963f7d28e17f72");  // RFC 1321
  EXPECT_EQ(digest_hex("", DigestKind::MD5), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(digest_hex("abc", DigestKind::SHA1), "a9993e364706816aba3e25717850c26c9cd0d89d");  // FIPS 180
  auto file = testing::scratch_dir() / "abc.txt";
  std::ofstream(file) << "abc";
  EXPECT_EQ(file_digest_hex(file, DigestKind::MD5), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_CONTAINS(testing::error_of([&] { file_digest_hex(file.parent_path() / "nope", DigestKind::MD5); }), "nope");
}

TEST(RunProcess, ReturnsExitCodeAndOutputWithoutAShell) {
  auto r = run_process({"sh", "-c", "echo out; echo err >&2; exit 3"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_CONTAINS(r.output, "out\n");
  EXPECT_CONTAINS(r.output, "err\n");
  // Arguments reach the program as they are: no word splitting or globbing.
  auto echo = run_process({"printf", "%s|", "a b", "*"});
  EXPECT_EQ(echo.output, "a b|*|");
  auto dir = testing::scratch_dir();
  EXPECT_EQ(run_process({"pwd"}, dir).output, std::filesystem::canonical(dir).string() + "\n");
  EXPECT_CONTAINS(testing::error_of([] { run_process({"kiln-no-such-program"}); }), "kiln-no-such-program");
  EXPECT_TRUE(program_in_path("sh"));
  EXPECT_FALSE(program_in_path("kiln-no-such-program"));
}

}  // namespace files_and_processes_test
}  // namespace kiln::io
