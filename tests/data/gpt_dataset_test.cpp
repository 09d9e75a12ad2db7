#include "kiln/data/gpt_dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "kiln/data/blended_dataset.h"
#include "kiln/data/indexed_dataset_writer.h"
#include "kiln/runtime/error.h"
#include "test_tokenizers.h"

namespace kiln::data {
namespace gpt_dataset_test {

namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;

// Token d * 1000 + i is token i of document d: every token says where it came from.
std::shared_ptr<const IndexedDataset> numbered_dataset(const fs::path& prefix, int documents, std::uint32_t seed) {
  IndexedDatasetWriter w(prefix, TokenDtype::Int32);
  std::mt19937 rng(seed);
  for (int d = 0; d < documents; ++d) {
    Ids doc(1 + rng() % 40);
    for (std::size_t i = 0; i < doc.size(); ++i) doc[i] = d * 1000 + static_cast<int>(i);
    w.add_document(doc);
  }
  w.finish();
  return std::make_shared<const IndexedDataset>(prefix);
}

TEST(Split, RoundsAndCorrectsAsMegatron) {
  auto r = split_ranges("969,30,1", 1000);
  EXPECT_EQ(r[0].begin, 0);
  EXPECT_EQ(r[0].end, 969);
  EXPECT_EQ(r[1].end, 999);
  EXPECT_EQ(r[2].end, 1000);
  // round(10/3) = 3 three times sums to 9: the one left over shifts every boundary by one.
  r = split_ranges("1,1,1", 10);
  EXPECT_EQ(r[0].end, 4);
  EXPECT_EQ(r[1].end, 7);
  EXPECT_EQ(r[2].end, 10);
  r = split_ranges("100", 10);
  EXPECT_EQ(r[0].end, 10);
  EXPECT_EQ(r[1].begin, r[1].end);
  EXPECT_THROW(split_ranges("0,0,0", 10), Error);
  EXPECT_THROW(split_ranges("", 10), Error);
}

TEST(Split, FindsTheNumbersAsMegatronsPatternDoes) {
  // [0-9]*\.?[0-9]+: "1.2.3" is 1.2 then .3; "12." is 12; any other text separates.
  auto r = split_ranges("1.2.3", 100);
  EXPECT_EQ(r[0].end, 80);
  EXPECT_EQ(r[1].end, 100);
  EXPECT_EQ(r[2].begin, r[2].end);
  r = split_ranges("train:12. valid:4", 16);
  EXPECT_EQ(r[0].end, 12);
  EXPECT_EQ(r[1].end, 16);
  r = split_ranges("..5 .5", 10);
  EXPECT_EQ(r[0].end, 5);
  EXPECT_EQ(r[1].end, 10);
  // A weight beyond double's range is a kiln::Error naming it, not std::stod's bare "stod".
  try {
    split_ranges(std::string(400, '9'), 10);
    ADD_FAILURE() << "a 400-digit weight was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
}

TEST(GptDataset, SamplesAreWindowsOfTheDocumentStreamThatShareOneToken) {
  auto dir = testing::scratch_dir("gpt-windows");
  auto data = numbered_dataset(dir / "ds", 200, 1);
  auto range = split_ranges("90,10", data->sequence_count())[0];
  GptDatasetConfig config{16, 1234, {}};
  GptDataset ds(data, range, 0, config);
  ASSERT_GT(ds.size(), 10);
  EXPECT_EQ(ds.epochs(), 1);
  EXPECT_EQ(ds.size(), (ds.tokens_per_epoch() - 1) / 16);
  std::set<std::int32_t> seen;
  for (std::int64_t i = 0; i < ds.size(); ++i) {
    Ids s = ds.sample(i);
    ASSERT_EQ(s.size(), 17u);
    for (std::size_t t = 0; t < s.size(); ++t) {
      int doc = s[t] / 1000;
      EXPECT_GE(doc, range.begin);
      EXPECT_LT(doc, range.end) << "a token from outside the train split";
      if (t > 0 && s[t] != s[t - 1] + 1) {
        // A document boundary: the next document starts at its first token, the last one ended.
        EXPECT_EQ(s[t] % 1000, 0);
        EXPECT_EQ(s[t - 1] % 1000 + 1, data->sequence_lengths()[s[t - 1] / 1000]);
      }
      seen.insert(s[t]);
    }
  }
  // One epoch without repeats, and each sample's last token is the next one's first.
  EXPECT_EQ(static_cast<std::int64_t>(seen.size()), ds.size() * 16 + 1);
}

TEST(GptDataset, DeterministicBySeedAndResumableFromASampleCounter) {
  auto dir = testing::scratch_dir("gpt-seed");
  auto data = numbered_dataset(dir / "ds", 100, 2);
  SplitRange all{0, data->sequence_count()};
  GptDataset a(data, all, 0, {8, 7, {}}), b(data, all, 0, {8, 7, {}}), c(data, all, 0, {8, 8, {}});
  int differ = 0;
  for (std::int64_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a.sample(i), b.sample(i));
    differ += a.sample(i) != c.sample(i);
  }
  EXPECT_GT(differ, a.size() / 2) << "another seed, another order";

  SampleCursor straight(a);
  std::vector<Ids> expected;
  Ids sample;
  while (straight.next(sample)) expected.push_back(sample);
  ASSERT_EQ(static_cast<std::int64_t>(expected.size()), a.size());
  SampleCursor resumed(b, 17);
  for (std::size_t i = 17; i < expected.size(); ++i) {
    ASSERT_TRUE(resumed.next(sample));
    EXPECT_EQ(sample, expected[i]);
  }
  EXPECT_FALSE(resumed.next(sample));
  EXPECT_EQ(resumed.position(), a.size());
}

TEST(GptDataset, ManyEpochsWhenMoreSamplesAreAsked) {
  auto dir = testing::scratch_dir("gpt-epochs");
  auto data = numbered_dataset(dir / "ds", 10, 3);
  GptDataset ds(data, {0, data->sequence_count()}, 1000, {32, 1, {}});
  EXPECT_EQ(ds.size(), 1000);
  EXPECT_GE(ds.epochs() * ds.tokens_per_epoch() - 1, 1000 * 32);
  EXPECT_LT((ds.epochs() - 1) * ds.tokens_per_epoch() - 1, 1000 * 32);
  for (std::int64_t i = 0; i < ds.size(); ++i) EXPECT_EQ(ds.sample(i).size(), 33u);
}

TEST(GptDataset, IndexCacheIsReusedAndRebuiltWhenDamaged) {
  auto dir = testing::scratch_dir("gpt-cache");
  auto data = numbered_dataset(dir / "ds", 50, 4);
  GptDatasetConfig config{8, 99, dir / "cache"};
  SplitRange all{0, data->sequence_count()};
  GptDataset first(data, all, 0, config);
  EXPECT_FALSE(first.loaded_from_cache());
  ASSERT_TRUE(fs::exists(first.cache_file()));
  GptDataset second(data, all, 0, config);
  EXPECT_TRUE(second.loaded_from_cache());
  for (std::int64_t i = 0; i < first.size(); ++i) EXPECT_EQ(first.sample(i), second.sample(i));
  GptDataset other_length(data, all, 0, {9, 99, dir / "cache"});
  EXPECT_FALSE(other_length.loaded_from_cache()) << "another sequence length is another cache";

  fs::resize_file(first.cache_file(), fs::file_size(first.cache_file()) - 5);
  GptDataset third(data, all, 0, config);
  EXPECT_FALSE(third.loaded_from_cache());
  for (std::int64_t i = 0; i < first.size(); ++i) EXPECT_EQ(first.sample(i), third.sample(i));
}

TEST(GptDataset, TooFewTokensIsAClearError) {
  auto dir = testing::scratch_dir("gpt-small");
  auto data = numbered_dataset(dir / "ds", 2, 5);
  try {
    GptDataset ds(data, {0, 2}, 0, {100000, 1, {}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than one sample"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find((dir / "ds").string()), std::string::npos) << e.what();
  }
}

TEST(BlendedDataset, FollowsTheWeightsAndTheSourceDatasetsSamples) {
  auto dir = testing::scratch_dir("blend");
  numbered_dataset(dir / "a", 300, 6);
  numbered_dataset(dir / "b", 300, 7);
  auto blend = parse_data_path(fmt::format("30 {} 70 {}", (dir / "a").string(), (dir / "b").string()));
  ASSERT_EQ(blend.size(), 2u);
  EXPECT_EQ(blend[1].weight, 70);
  auto splits = build_gpt_datasets(blend, "98,2", {1000, 20, 0}, {8, 3, dir / "cache"});
  ASSERT_TRUE(splits[0] && splits[1]);
  EXPECT_FALSE(splits[2]) << "no test split";
  EXPECT_EQ(splits[0]->size(), 1000);
  const auto& train = dynamic_cast<const BlendedDataset&>(*splits[0]);
  int from_a = 0;
  for (std::int64_t i = 0; i < train.size(); ++i) from_a += train.source(i) == 0;
  EXPECT_NEAR(from_a, 300, 1);
  // Sample 0 goes to the dataset with the largest weight; its first sample.
  EXPECT_EQ(train.source(0), 1);
  auto b = std::make_shared<const IndexedDataset>(dir / "b");
  GptDataset b_train(b, split_ranges("98,2", b->sequence_count())[0],
                     static_cast<std::int64_t>(std::ceil(0.7 * 1000 * 1.005)), {8, 3, {}});
  EXPECT_EQ(train.sample(0), b_train.sample(0));

  EXPECT_THROW(parse_data_path("0.3 a 0.7"), Error);
  EXPECT_THROW(parse_data_path("x a y b"), Error);
  EXPECT_THROW(build_gpt_datasets(blend, "98,2", {0, 0, 0}, {8, 3, {}}), Error);
}

}  // namespace gpt_dataset_test
}  // namespace kiln::data
