#include "kiln/io/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kiln::io {
namespace crc32c_test {

// Known answers: the CRC catalogue's check value, and the iSCSI test patterns of RFC 3720 B.4.
TEST(Crc32c, MatchesPublishedVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending += static_cast<char>(i);
    descending += static_cast<char>(31 - i);
  }
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(Crc32c, ContinuesAcrossPieces) {
  const std::string text = "The quick brown fox jumps over the lazy dog";
  const auto whole = crc32c(text);
  const auto first = crc32c(text.data(), 10);
  EXPECT_EQ(crc32c(text.data() + 10, text.size() - 10, first), whole);
}

TEST(Crc32c, MaskRotatesAndAddsTheTfRecordConstant) {
  EXPECT_EQ(mask_crc32c(0), 0xa282ead8u);
  EXPECT_EQ(mask_crc32c(1u << 15), 1u + 0xa282ead8u);
  EXPECT_EQ(mask_crc32c(1), (1u << 17) + 0xa282ead8u);
}

}  // namespace crc32c_test
}  // namespace kiln::io
