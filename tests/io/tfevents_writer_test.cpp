// TensorBoard event files, read back with an independent little TFRecord + protobuf reader.
// (When python3 has the `tensorboard` package, tests/integration could load them with it; it is
// not installed here, so the framing, CRCs and fields are checked by parsing.)
#include "kiln/io/tfevents_writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "io_test_util.h"
#include "kiln/io/crc32c.h"

namespace kiln::io {
namespace tfevents_writer_test {

using testing::read_all;
using testing::scratch_dir;

std::uint64_t le(const std::string& bytes, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(bytes[at + std::size_t(i)]);
  return v;
}

// TensorBoard's name, events.out.tfevents.<10-digit seconds>.<host...> (checked by hand: libstdc++'s
// std::regex trips -Wmaybe-uninitialized in optimised sanitizer builds).
bool is_tfevents_name(const std::string& name) {
  const std::string prefix = "events.out.tfevents.";
  if (!name.starts_with(prefix) || name.size() < prefix.size() + 12) return false;
  auto seconds = name.begin() + static_cast<std::ptrdiff_t>(prefix.size());
  return std::all_of(seconds, seconds + 10, [](char c) { return c >= '0' && c <= '9'; }) && seconds[10] == '.';
}

// Splits a TFRecord stream into its records, checking both masked CRCs of each.
std::vector<std::string> read_records(const std::string& file) {
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < file.size()) {
    EXPECT_GE(file.size() - at, 16u) << "truncated record header at " << at;
    const std::uint64_t length = le(file, at, 8);
    EXPECT_EQ(le(file, at + 8, 4), mask_crc32c(crc32c(file.data() + at, 8))) << "length CRC at " << at;
    EXPECT_LE(at + 12 + length + 4, file.size());
    std::string data = file.substr(at + 12, length);
    EXPECT_EQ(le(file, at + 12 + length, 4), mask_crc32c(crc32c(data))) << "data CRC at " << at;
    records.push_back(data);
    at += 12 + length + 4;
  }
  return records;
}

// A protobuf message as field number -> raw value (varint value, fixed bytes or length-delimited bytes).
struct Field {
  int wire_type = 0;
  std::uint64_t varint = 0;
  std::string bytes;
};
std::multimap<int, Field> parse_message(const std::string& m) {
  std::multimap<int, Field> fields;
  std::size_t at = 0;
  auto varint = [&] {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      unsigned char b = static_cast<unsigned char>(m.at(at++));
      v |= std::uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (at < m.size()) {
    const std::uint64_t key = varint();
    Field f;
    f.wire_type = int(key & 7);
    if (f.wire_type == 0) {
      f.varint = varint();
    } else if (f.wire_type == 1 || f.wire_type == 5) {
      const std::size_t n = f.wire_type == 1 ? 8 : 4;
      f.bytes = m.substr(at, n);
      at += n;
    } else if (f.wire_type == 2) {
      const std::size_t n = varint();
      f.bytes = m.substr(at, n);
      at += n;
    } else {
      ADD_FAILURE() << "unexpected wire type " << f.wire_type;
      break;
    }
    fields.emplace(int(key >> 3), f);
  }
  return fields;
}

template <typename T>
T fixed(const std::string& bytes) {
  T v;
  EXPECT_EQ(bytes.size(), sizeof(T));
  std::memcpy(&v, bytes.data(), sizeof(T));
  return v;
}

TEST(TfEventsWriter, WritesFramedEventsWithFileVersionThenScalars) {
  auto dir = scratch_dir();
  std::filesystem::path path;
  {
    TfEventsWriter writer(dir / "run1");
    path = writer.path();
    writer.add_scalar("loss/train", 2.25f, 1, 1700000000.5);
    writer.add_scalar("accuracy/val", 0.625f, 300, 1700000001.0);
    writer.add_scalar("lr", 0.1f, 0);
  }
  EXPECT_TRUE(is_tfevents_name(path.filename().string())) << path.filename();

  auto records = read_records(read_all(path));
  ASSERT_EQ(records.size(), 4u);

  auto first = parse_message(records[0]);
  ASSERT_EQ(first.count(1), 1u);
  EXPECT_EQ(first.find(1)->second.wire_type, 1);
  EXPECT_GT(fixed<double>(first.find(1)->second.bytes), 1.6e9);
  ASSERT_EQ(first.count(3), 1u);
  EXPECT_EQ(first.find(3)->second.bytes, "brain.Event:2");

  struct Expected {
    double wall_time;
    std::uint64_t step;
    std::string tag;
    float value;
  };
  const Expected expected[] = {{1700000000.5, 1, "loss/train", 2.25f}, {1700000001.0, 300, "accuracy/val", 0.625f}};
  for (int i = 0; i < 2; ++i) {
    auto event = parse_message(records[std::size_t(i) + 1]);
    EXPECT_EQ(fixed<double>(event.find(1)->second.bytes), expected[i].wall_time);
    ASSERT_EQ(event.count(2), 1u);
    EXPECT_EQ(event.find(2)->second.varint, expected[i].step);
    ASSERT_EQ(event.count(5), 1u);
    auto summary = parse_message(event.find(5)->second.bytes);
    ASSERT_EQ(summary.count(1), 1u);
    auto value = parse_message(summary.find(1)->second.bytes);
    EXPECT_EQ(value.find(1)->second.bytes, expected[i].tag);
    EXPECT_EQ(value.find(2)->second.wire_type, 5);
    EXPECT_EQ(fixed<float>(value.find(2)->second.bytes), expected[i].value);
  }
  auto lr = parse_message(records[3]);
  EXPECT_EQ(lr.count(2), 0u) << "step 0 is the proto3 default and left out";
}

TEST(TfEventsWriter, TwoWritersInOneFolderGetTwoFiles) {
  auto dir = scratch_dir();
  TfEventsWriter a(dir), b(dir);
  EXPECT_NE(a.path(), b.path());
}

TEST(TfEventsWriter, FrameMatchesAHandComputedRecord) {
  const std::string data = "abc";
  const std::string frame = tfrecord_frame(data);
  ASSERT_EQ(frame.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(le(frame, 0, 8), 3u);
  const std::string length_bytes("\x03\0\0\0\0\0\0\0", 8);
  EXPECT_EQ(le(frame, 8, 4), mask_crc32c(crc32c(length_bytes)));
  EXPECT_EQ(frame.substr(12, 3), "abc");
  EXPECT_EQ(le(frame, 15, 4), mask_crc32c(0x364B3FB7u));  // CRC-32C("abc")
}

}  // namespace tfevents_writer_test
}  // namespace kiln::io
