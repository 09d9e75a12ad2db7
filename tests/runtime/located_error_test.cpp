// Located errors: KILN_CHECK / KILN_FAIL keep the source location in what() (logs, tests) and apart
// from the message (what the `kiln` command line shows users unless --verbose).
#include "kiln/runtime/located_error.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace kiln {
namespace located_error_test {

TEST(LocatedError, MessageAndLocationApart) {
  int line = 0;
  try {
    line = __LINE__ + 1;
    KILN_FAIL("tensor {} has the wrong shape", "x");
  } catch (const Error& e) {
    const auto* located = dynamic_cast<const SourceLocated*>(&e);
    ASSERT_NE(located, nullptr) << e.what();
    EXPECT_EQ(located->message(), "tensor x has the wrong shape");
    EXPECT_EQ(located->file(), "tests/runtime/located_error_test.cpp");
    EXPECT_EQ(located->line(), line);
    EXPECT_EQ(std::string(e.what()),
              "tensor x has the wrong shape (tests/runtime/located_error_test.cpp:" + std::to_string(line) + ")");
    EXPECT_EQ(error_message(e), "tensor x has the wrong shape");
    EXPECT_EQ(error_message(e, /*with_location=*/true), e.what());
    return;
  }
  FAIL() << "KILN_FAIL did not throw kiln::Error";
}

TEST(LocatedError, OtherExceptionsShowWhatTheySay) {
  std::runtime_error plain("map::at");
  EXPECT_EQ(error_message(plain), "map::at");
  Error unlocated("out of memory on cuda:0");
  EXPECT_EQ(error_message(unlocated), "out of memory on cuda:0");
}

TEST(LocatedError, OutOfMemoryStaysCatchableAsSuch) {
  try {
    throw LocatedOutOfMemoryError("CUDA error cudaErrorMemoryAllocation in cudaMalloc", "/x/src/kiln/a.cpp", 7);
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(error_message(e), "CUDA error cudaErrorMemoryAllocation in cudaMalloc");
    EXPECT_EQ(std::string(e.what()), "CUDA error cudaErrorMemoryAllocation in cudaMalloc (kiln/a.cpp:7)");
  }
}

TEST(LocatedError, ShortSourcePathDropsTheCheckout) {
  EXPECT_STREQ(short_source_path("/home/u/kiln/src/kiln/ops/matmul.cpp"), "kiln/ops/matmul.cpp");
  EXPECT_STREQ(short_source_path("../src/kiln/ops/matmul.cpp"), "kiln/ops/matmul.cpp");
  EXPECT_STREQ(short_source_path("/work/wt/apps/kiln/cmd_hpl.cpp"), "apps/kiln/cmd_hpl.cpp");
  // A checkout under a folder that happens to be called src/ or apps/: the repository's own wins.
  EXPECT_STREQ(short_source_path("/srv/apps/kiln/src/kiln/io/atomic_file.cpp"), "kiln/io/atomic_file.cpp");
  EXPECT_STREQ(short_source_path("/opt/src/kiln-checkout/tests/io/x.cpp"), "tests/io/x.cpp");
  EXPECT_STREQ(short_source_path("elsewhere.cpp"), "elsewhere.cpp");
  // "myapps/" is not "apps/": only whole path components count.
  EXPECT_STREQ(short_source_path("/myapps/x.cpp"), "/myapps/x.cpp");
}

}  // namespace located_error_test
}  // namespace kiln
