#include "kiln/data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <cstring>

#include "kiln/data/indexed_dataset_writer.h"
#include "kiln/data/tokenizer_files.h"
#include "kiln/runtime/error.h"
#include "test_tokenizers.h"

namespace kiln::data {
namespace indexed_dataset_test {

namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;

// Little-endian bytes, written out one field at a time from the format's description, not with
// Kiln's writer: the golden files below are what Megatron's IndexedDatasetBuilder writes.
struct Bytes {
  std::string data;
  Bytes& raw(std::string_view s) {
    data += s;
    return *this;
  }
  template <typename T>
  Bytes& le(T v) {
    for (std::size_t i = 0; i < sizeof(T); ++i)
      data.push_back(static_cast<char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xFF));
    return *this;
  }
};

// Three documents [5, 6, 7], [], [65535, 1] in uint16, with --append-eod already applied.
std::string golden_index() {
  Bytes b;
  b.raw(std::string_view("MMIDIDX\0\0", 9)).le<std::uint64_t>(1).le<std::uint8_t>(8);
  b.le<std::uint64_t>(2);                     // sequences
  b.le<std::uint64_t>(4);                     // document indices (3 documents + 1)
  b.le<std::int32_t>(3).le<std::int32_t>(2);  // lengths
  b.le<std::int64_t>(0).le<std::int64_t>(6);  // byte pointers
  b.le<std::int64_t>(0).le<std::int64_t>(1).le<std::int64_t>(1).le<std::int64_t>(2);  // document indices
  return b.data;
}

std::string golden_bin() {
  Bytes b;
  b.le<std::uint16_t>(5).le<std::uint16_t>(6).le<std::uint16_t>(7).le<std::uint16_t>(65535).le<std::uint16_t>(1);
  return b.data;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(IndexedDatasetWriter, WritesMegatronsBytesExactly) {
  auto dir = testing::scratch_dir("idx-golden");
  {
    IndexedDatasetWriter w(dir / "ds", TokenDtype::UInt16);
    w.add_document(Ids{5, 6, 7});
    w.add_document(Ids{});
    w.add_document(Ids{65535, 1});
    EXPECT_FALSE(fs::exists(dir / "ds.bin")) << "the .bin appears only when finished";
    w.finish();
  }
  EXPECT_EQ(read_text_file(dir / "ds.idx"), golden_index());
  EXPECT_EQ(read_text_file(dir / "ds.bin"), golden_bin());
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << "left behind: " << entry.path();
  }
}

TEST(IndexedDataset, ReadsAFileItDidNotWrite) {
  auto dir = testing::scratch_dir("idx-foreign");
  testing::write_file(dir / "ds.idx", golden_index());
  testing::write_file(dir / "ds.bin", golden_bin());
  IndexedDataset ds(dir / "ds");
  EXPECT_EQ(ds.dtype(), TokenDtype::UInt16);
  EXPECT_EQ(ds.sequence_count(), 2);
  EXPECT_EQ(ds.document_count(), 3);
  EXPECT_EQ(ds.token_count(), 5);
  EXPECT_EQ(ds.sequence(0), (Ids{5, 6, 7}));
  EXPECT_EQ(ds.sequence(1), (Ids{65535, 1}));
  EXPECT_EQ(ds.document(1), Ids{});
  EXPECT_EQ(ds.document(2), (Ids{65535, 1}));
  Ids part(2);
  ds.read(0, 1, 2, part.data());
  EXPECT_EQ(part, (Ids{6, 7}));
  EXPECT_THROW(ds.read(0, 2, 2, part.data()), Error);
  IndexedDataset by_file_name(dir / "ds.idx");
  EXPECT_EQ(by_file_name.token_count(), 5);
}

TEST(IndexedDataset, Int32AndSentenceLevelDocumentsRoundTrip) {
  auto dir = testing::scratch_dir("idx-int32");
  {
    IndexedDatasetWriter w(dir / "ds", TokenDtype::Int32);
    w.add_document(Ids{128000, 1, 2, 128001}, std::vector<std::int32_t>{1, 3});
    w.add_document(Ids{70000});
    w.finish();
  }
  IndexedDataset ds(dir / "ds");
  EXPECT_EQ(ds.dtype(), TokenDtype::Int32);
  EXPECT_EQ(ds.sequence_count(), 3);
  EXPECT_EQ(ds.document_count(), 2);
  EXPECT_EQ(ds.document(0), (Ids{128000, 1, 2, 128001}));
  EXPECT_EQ(ds.sequence(2), (Ids{70000}));
  EXPECT_EQ(optimal_token_dtype(50257), TokenDtype::UInt16);
  EXPECT_EQ(optimal_token_dtype(128256), TokenDtype::Int32);
}

TEST(IndexedDatasetWriter, RejectsIdsTheDtypeCannotHold) {
  auto dir = testing::scratch_dir("idx-range");
  IndexedDatasetWriter w(dir / "ds", TokenDtype::UInt16);
  EXPECT_NE(error_of([&] { w.add_document(Ids{65536}); }).find("does not fit its dtype uint16"), std::string::npos);
  EXPECT_THROW(IndexedDatasetWriter(dir / "f", TokenDtype::Float32), Error);
}

TEST(IndexedDatasetWriter, UnfinishedWriterLeavesNothing) {
  auto dir = testing::scratch_dir("idx-abandoned");
  {
    IndexedDatasetWriter w(dir / "ds", TokenDtype::UInt16);
    w.add_document(Ids{1, 2});
  }
  EXPECT_TRUE(fs::is_empty(dir));
}

struct Corruption {
  const char* name;
  std::function<void(std::string& idx, std::string& bin)> damage;
  const char* expected;  // part of the message
};

TEST(IndexedDataset, TruncatedOrForeignFilesNameTheFileAndTheProblem) {
  std::vector<Corruption> cases = {
      {"empty", [](std::string& idx, std::string&) { idx.clear(); }, "does not start with"},
      {"foreign", [](std::string& idx, std::string&) { idx = "PK\x03\x04 a zip file, not an index"; },
       "is not a Megatron indexed dataset index"},
      {"version", [](std::string& idx, std::string&) { idx[9] = 2; }, "index version 2 is not supported"},
      {"dtype", [](std::string& idx, std::string&) { idx[17] = 42; }, "dtype code 42"},
      {"float", [](std::string& idx, std::string&) { idx[17] = 7; }, "does not hold token ids"},
      {"header cut", [](std::string& idx, std::string&) { idx.resize(20); }, "the sequence count"},
      {"lengths cut", [](std::string& idx, std::string&) { idx.resize(36); }, "the sequence lengths"},
      {"indices cut", [](std::string& idx, std::string&) { idx.resize(idx.size() - 3); }, "the document indices"},
      {"trailing", [](std::string& idx, std::string&) { idx += "xx"; }, "2 bytes after the document indices"},
      {"huge count", [](std::string& idx, std::string&) { idx[25] = 0x7f; }, "is truncated"},
      {"bin cut", [](std::string&, std::string& bin) { bin.resize(7); }, "lies outside the 7-byte .bin"},
      {"bad doc index", [](std::string& idx, std::string&) { idx[idx.size() - 8] = 9; }, "document index"},
  };
  auto dir = testing::scratch_dir("idx-corrupt");
  for (const auto& c : cases) {
    std::string idx = golden_index(), bin = golden_bin();
    c.damage(idx, bin);
    testing::write_file(dir / "ds.idx", idx);
    testing::write_file(dir / "ds.bin", bin);
    std::string message = error_of([&] { IndexedDataset ds(dir / "ds"); });
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.name << ": " << message;
    EXPECT_NE(message.find((dir / "ds").string()), std::string::npos) << c.name << ": " << message;
  }
  testing::write_file(dir / "ds.idx", golden_index());
  fs::remove(dir / "ds.bin");
  EXPECT_NE(error_of([&] { IndexedDataset ds(dir / "ds"); }).find("ds.bin"), std::string::npos);
}

}  // namespace indexed_dataset_test
}  // namespace kiln::data
