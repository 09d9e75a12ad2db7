// Faults of the indexed-dataset files (issue 15, "Bad input and faults"): a failed commit keeps the
// old dataset, a killed writer's leftovers are cleaned up, a foreign or damaged .bin/.idx is refused
// with what is wrong, a damaged GPT index cache is rebuilt instead of read out of bounds.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "kiln/data/gpt_dataset.h"
#include "kiln/data/indexed_dataset.h"
#include "kiln/data/indexed_dataset_writer.h"
#include "kiln/data/tokenizer_files.h"
#include "kiln/runtime/error.h"
#include "test_tokenizers.h"

namespace kiln::data {
namespace dataset_faults_test {

namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

void write_dataset(const fs::path& prefix, const std::vector<Ids>& documents) {
  IndexedDatasetWriter w(prefix, TokenDtype::UInt16);
  for (const auto& d : documents) w.add_document(d);
  w.finish();
}

std::vector<Ids> read_dataset(const fs::path& prefix) {
  IndexedDataset ds(prefix);
  std::vector<Ids> out;
  for (std::int64_t d = 0; d < ds.document_count(); ++d) out.push_back(ds.document(d));
  return out;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The id of a process that has exited (and been reaped): files named after it are stale.
long dead_pid() {
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

const std::vector<Ids> kOld{{1, 2, 3}, {4, 5}};
const std::vector<Ids> kNew{{9, 9, 9, 9}, {8}, {7, 7}};

TEST(DatasetCommit, FailedSecondRenameKeepsTheOldDataset) {
  auto dir = testing::scratch_dir("commit-idx");
  write_dataset(dir / "ds", kOld);
  IndexedDatasetWriter w(dir / "ds", TokenDtype::UInt16);
  for (const auto& d : kNew) w.add_document(d);
  w.set_rename_for_testing([](const fs::path& from, const fs::path& to) {
    if (to.extension() == ".idx") throw std::runtime_error("injected: rename of the .idx failed");
    fs::rename(from, to);
  });
  std::string error = error_of([&] { w.finish(); });
  EXPECT_NE(error.find("cannot rename"), std::string::npos) << error;
  EXPECT_NE(error.find("ds.idx"), std::string::npos) << error;
  EXPECT_NE(error.find("restored"), std::string::npos) << error;
  // The old pair is whole: the new .bin beside the old .idx would read the wrong tokens.
  EXPECT_EQ(read_dataset(dir / "ds"), kOld);
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"ds.bin", "ds.idx"}));
}

TEST(DatasetCommit, FailedFirstRenameChangesNothing) {
  auto dir = testing::scratch_dir("commit-bin");
  write_dataset(dir / "ds", kOld);
  IndexedDatasetWriter w(dir / "ds", TokenDtype::UInt16);
  for (const auto& d : kNew) w.add_document(d);
  w.set_rename_for_testing([](const fs::path&, const fs::path&) { throw std::runtime_error("injected"); });
  EXPECT_NE(error_of([&] { w.finish(); }).find("unchanged"), std::string::npos);
  EXPECT_EQ(read_dataset(dir / "ds"), kOld);
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"ds.bin", "ds.idx"}));
}

TEST(DatasetCommit, FailedSecondRenameOfANewDatasetLeavesNoLoneBin) {
  auto dir = testing::scratch_dir("commit-new");
  IndexedDatasetWriter w(dir / "ds", TokenDtype::UInt16);
  for (const auto& d : kNew) w.add_document(d);
  w.set_rename_for_testing([](const fs::path& from, const fs::path& to) {
    if (to.extension() == ".idx") throw std::runtime_error("injected");
    fs::rename(from, to);
  });
  EXPECT_NE(error_of([&] { w.finish(); }), "no error");
  EXPECT_TRUE(names_in(dir).empty()) << names_in(dir).front();
}

TEST(DatasetCommit, ReplacingADatasetLeavesOnlyTheNewPair) {
  auto dir = testing::scratch_dir("commit-ok");
  write_dataset(dir / "ds", kOld);
  write_dataset(dir / "ds", kNew);
  EXPECT_EQ(read_dataset(dir / "ds"), kNew);
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"ds.bin", "ds.idx"}));
}

TEST(DatasetCommit, TemporariesOfAKilledWriterAreRemovedAndReported) {
  auto dir = testing::scratch_dir("stale");
  write_dataset(dir / "ds", kOld);
  long dead = dead_pid();
  long alive = ::getppid();  // another process's temporaries, still being written: left alone
  testing::write_file(dir / fmt::format("ds.bin.tmp.{}", dead), "half a .bin");
  testing::write_file(dir / fmt::format("ds.idx.tmp.{}", dead), "half an .idx");
  testing::write_file(dir / fmt::format("ds.bin.tmp.{}", alive), "someone else's");
  testing::write_file(dir / fmt::format("other.bin.tmp.{}", dead), "another prefix's");
  IndexedDatasetWriter w(dir / "ds", TokenDtype::UInt16);
  ASSERT_EQ(w.stale_files_removed().size(), 2u);
  for (const auto& line : w.stale_files_removed()) {
    EXPECT_NE(line.find(fmt::format("left by process {}, which is gone", dead)), std::string::npos) << line;
  }
  EXPECT_FALSE(fs::exists(dir / fmt::format("ds.bin.tmp.{}", dead)));
  EXPECT_FALSE(fs::exists(dir / fmt::format("ds.idx.tmp.{}", dead)));
  EXPECT_TRUE(fs::exists(dir / fmt::format("ds.bin.tmp.{}", alive)));
  EXPECT_TRUE(fs::exists(dir / fmt::format("other.bin.tmp.{}", dead)));
  EXPECT_EQ(read_dataset(dir / "ds"), kOld);
}

TEST(DatasetCommit, CommitCutBetweenItsRenamesIsCompletedByTheNextWriter) {
  auto dir = testing::scratch_dir("rollforward");
  write_dataset(dir / "ds", kOld);
  write_dataset(dir / "new", kNew);
  // What a writer killed between its two renames leaves: the new .bin in place, the old .bin kept
  // as .bin.old.P, the new index still under its temporary name.
  long dead = dead_pid();
  fs::rename(dir / "ds.bin", dir / fmt::format("ds.bin.old.{}", dead));
  fs::rename(dir / "new.bin", dir / "ds.bin");
  fs::rename(dir / "new.idx", dir / fmt::format("ds.idx.tmp.{}", dead));
  {
    IndexedDatasetWriter w(dir / "ds", TokenDtype::UInt16);
    ASSERT_EQ(w.stale_files_removed().size(), 2u);
    EXPECT_NE(w.stale_files_removed()[0].find("completed the commit of process"), std::string::npos);
  }
  EXPECT_EQ(read_dataset(dir / "ds"), kNew);
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"ds.bin", "ds.idx"}));
}

TEST(IndexedDatasetFaults, ALargerForeignBinIsRefused) {
  auto dir = testing::scratch_dir("foreign-bin");
  write_dataset(dir / "small", kOld);
  write_dataset(dir / "large", kNew);
  fs::copy_file(dir / "large.bin", dir / "small.bin", fs::copy_options::overwrite_existing);
  std::string error = error_of([&] { IndexedDataset ds(dir / "small"); });
  EXPECT_NE(error.find("small.bin has 14 bytes, but"), std::string::npos) << error;
  EXPECT_NE(error.find("describes 10 bytes of tokens"), std::string::npos) << error;
  EXPECT_NE(error.find("longer than its index says"), std::string::npos) << error;
}

TEST(IndexedDatasetFaults, AHugeCountNamesTheCountNotZeroBytes) {
  auto dir = testing::scratch_dir("huge-count");
  std::string idx("MMIDIDX\0\0", 9);
  auto le = [&](auto v) { idx.append(reinterpret_cast<const char*>(&v), sizeof v); };
  le(std::uint64_t{1});
  le(std::uint8_t{8});
  le(std::uint64_t{1} << 63);  // sequences: times 4 bytes wraps to 0 in 64 bits
  le(std::uint64_t{1});
  testing::write_file(dir / "ds.idx", idx);
  testing::write_file(dir / "ds.bin", "");
  std::string error = error_of([&] { IndexedDataset ds(dir / "ds"); });
  EXPECT_NE(error.find("9223372036854775808 entries"), std::string::npos) << error;
  EXPECT_NE(error.find("more than 2^64"), std::string::npos) << error;
  EXPECT_EQ(error.find("needs 0 bytes"), std::string::npos) << error;
}

// The cache file's layout (gpt_dataset.cpp): magic, description size and text, three counts, the
// three arrays, the FNV-1a checksum of their 64-bit words.
struct CacheFile {
  std::string bytes;
  std::size_t arrays = 0;  // offset of the first array
  std::int64_t counts[3] = {};

  explicit CacheFile(const fs::path& path) : bytes(read_text_file(path)) {
    std::uint64_t description = 0;
    std::memcpy(&description, bytes.data() + 8, 8);
    std::memcpy(counts, bytes.data() + 16 + description, sizeof counts);
    arrays = 16 + description + sizeof counts;
  }
  // The arrays follow a description of any length, so a word may be misaligned: copy it in.
  void set_word(int array, std::int64_t i, std::int64_t value) {
    std::size_t at = arrays;
    for (int a = 0; a < array; ++a) at += static_cast<std::size_t>(counts[a]) * 8;
    std::memcpy(bytes.data() + at + static_cast<std::size_t>(i) * 8, &value, 8);
  }
  void reseal() {  // a checksum that matches the edited arrays, as a buggy writer would leave
    std::uint64_t h = 0xcbf29ce484222325ull;
    std::size_t words = static_cast<std::size_t>(counts[0] + counts[1] + counts[2]);
    for (std::size_t w = 0; w < words; ++w) {
      std::uint64_t v = 0;
      std::memcpy(&v, bytes.data() + arrays + 8 * w, 8);
      h ^= v;
      h *= 0x100000001b3ull;
    }
    std::memcpy(bytes.data() + arrays + 8 * words, &h, 8);
  }
};

std::shared_ptr<const IndexedDataset> counting_dataset(const fs::path& prefix) {
  std::vector<Ids> docs;
  for (int d = 0; d < 40; ++d) docs.push_back(Ids(static_cast<std::size_t>(3 + d % 5), d));
  write_dataset(prefix, docs);
  return std::make_shared<const IndexedDataset>(prefix);
}

TEST(GptDatasetCache, DamagedBytesOfTheSameSizeAreRebuiltNotRead) {
  auto dir = testing::scratch_dir("cache-damaged");
  auto data = counting_dataset(dir / "ds");
  GptDatasetConfig config{8, 7, dir / "cache"};
  SplitRange all{0, data->sequence_count()};
  GptDataset first(data, all, 0, config);
  ASSERT_TRUE(fs::exists(first.cache_file()));
  CacheFile cache(first.cache_file());
  // A sample boundary far outside the documents: read as is, sample() runs off the dataset.
  cache.set_word(1, 3, std::int64_t{1} << 40);
  auto size = fs::file_size(first.cache_file());
  testing::write_file(first.cache_file(), cache.bytes);
  ASSERT_EQ(fs::file_size(first.cache_file()), size);

  GptDataset second(data, all, 0, config);
  EXPECT_FALSE(second.loaded_from_cache());
  EXPECT_NE(second.cache_rebuilt_because().find("checksum"), std::string::npos) << second.cache_rebuilt_because();
  for (std::int64_t i = 0; i < first.size(); ++i) EXPECT_EQ(first.sample(i), second.sample(i));
  GptDataset third(data, all, 0, config);
  EXPECT_TRUE(third.loaded_from_cache()) << "the rebuilt cache is written back";
}

TEST(GptDatasetCache, EntriesOutsideTheDatasetAreRefusedEvenWithAMatchingChecksum) {
  auto dir = testing::scratch_dir("cache-bounds");
  auto data = counting_dataset(dir / "ds");
  GptDatasetConfig config{8, 7, dir / "cache"};
  SplitRange all{0, data->sequence_count()};
  GptDataset first(data, all, 0, config);
  struct Edit {
    int array;
    std::int64_t index;
    std::int64_t value;
    const char* why;
  };
  for (Edit edit :
       {Edit{0, 2, 1000, "document_index[2] = 1000 is outside"},
        Edit{1, 3, 1 << 20, "sample boundary 1 is at token 1048576"}, Edit{2, 0, -1, "shuffle_index[0] = -1"}}) {
    CacheFile cache(first.cache_file());
    cache.set_word(edit.array, edit.index, edit.value);
    cache.reseal();
    testing::write_file(first.cache_file(), cache.bytes);
    GptDataset again(data, all, 0, config);
    EXPECT_FALSE(again.loaded_from_cache());
    EXPECT_NE(again.cache_rebuilt_because().find(edit.why), std::string::npos) << again.cache_rebuilt_because();
    for (std::int64_t i = 0; i < first.size(); ++i) EXPECT_EQ(first.sample(i), again.sample(i));
  }
}

}  // namespace dataset_faults_test
}  // namespace kiln::data
