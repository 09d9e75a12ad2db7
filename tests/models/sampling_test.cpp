// The sampler's distributions against ones computed by hand, and its draws against those
// distributions.
#include "kiln/models/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kiln/runtime/error.h"

namespace kiln::models {
namespace sampling_test {

// Logits whose softmax is exactly 0.1, 0.2, 0.3, 0.4 (up to float rounding of the logs).
std::vector<float> tenths() { return {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)}; }

void expect_probs(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "token " << i;
}

TEST(Sampling, TemperatureOneIsTheSoftmax) { expect_probs(sampling_distribution(tenths(), {}), {0.1, 0.2, 0.3, 0.4}); }

TEST(Sampling, TemperatureTwoTakesTheSquareRoot) {
  // p^(1/2) normalised: sqrt(.1), sqrt(.2), sqrt(.3), sqrt(.4) over their sum.
  const double s = std::sqrt(0.1) + std::sqrt(0.2) + std::sqrt(0.3) + std::sqrt(0.4);
  expect_probs(sampling_distribution(tenths(), {.temperature = 2}),
               {std::sqrt(0.1) / s, std::sqrt(0.2) / s, std::sqrt(0.3) / s, std::sqrt(0.4) / s});
  // Temperature 0.5 squares: .01 .04 .09 .16 over .30.
  expect_probs(sampling_distribution(tenths(), {.temperature = 0.5}), {1 / 30.0, 4 / 30.0, 9 / 30.0, 16 / 30.0});
}

TEST(Sampling, TopKKeepsTheKMostLikely) {
  expect_probs(sampling_distribution(tenths(), {.top_k = 2}), {0, 0, 3 / 7.0, 4 / 7.0});
  expect_probs(sampling_distribution(tenths(), {.top_k = 1}), {0, 0, 0, 1});
  expect_probs(sampling_distribution(tenths(), {.top_k = 10}), {0.1, 0.2, 0.3, 0.4});
  // Ties at the boundary go to the lower id, so exactly k stay.
  expect_probs(sampling_distribution(std::vector<float>{1, 2, 2, 0}, {.top_k = 1}), {0, 1, 0, 0});
}

TEST(Sampling, TopPKeepsTheSmallestNucleusReachingP) {
  // Sorted: .4, .3, .2, .1; cumulative .4, .7, .9, 1.0.
  expect_probs(sampling_distribution(tenths(), {.top_p = 0.35}), {0, 0, 0, 1});
  expect_probs(sampling_distribution(tenths(), {.top_p = 0.5}), {0, 0, 3 / 7.0, 4 / 7.0});
  expect_probs(sampling_distribution(tenths(), {.top_p = 0.8}), {0, 2 / 9.0, 3 / 9.0, 4 / 9.0});
  expect_probs(sampling_distribution(tenths(), {.top_p = 0.95}), {0.1, 0.2, 0.3, 0.4});
}

TEST(Sampling, TopPOverALargeVocabularyMatchesAFullSort) {
  // 5000 tokens with a long tail: the nucleus of 0.97 spans more than the first window of 256,
  // so the window is widened; the kept set must be the one a full sort gives.
  std::vector<float> logits(5000);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = -0.002f * static_cast<float>((i * 7919) % 5000);
  const auto probs = sampling_distribution(logits, {.top_p = 0.97});
  std::vector<std::size_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), std::size_t{0});
  std::sort(ids.begin(), ids.end(), [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
  double total = 0, mass = 0;
  for (float l : logits) total += std::exp(static_cast<double>(l));
  std::size_t nucleus = 0;
  while (mass < 0.97) mass += std::exp(static_cast<double>(logits[ids[nucleus++]])) / total;
  EXPECT_GT(nucleus, 256u);
  for (std::size_t r = 0; r < ids.size(); ++r) {
    if (r < nucleus) {
      EXPECT_NEAR(probs[ids[r]], std::exp(static_cast<double>(logits[ids[r]])) / total / mass, 1e-9) << r;
    } else {
      EXPECT_EQ(probs[ids[r]], 0.0) << "rank " << r << " is outside the nucleus of " << nucleus;
    }
  }
}

TEST(Sampling, TemperatureThenTopKThenTopP) {
  // T=0.5: 1/30, 4/30, 9/30, 16/30; top-k 3 drops token 0: 4/29, 9/29, 16/29;
  // top-p .6: 16/29 = .552 < .6, + 9/29 = .862 >= .6: tokens 2, 3 with 9/25, 16/25.
  expect_probs(sampling_distribution(tenths(), {.temperature = 0.5, .top_k = 3, .top_p = 0.6}),
               {0, 0, 9 / 25.0, 16 / 25.0});
}

TEST(Sampling, GreedyIsTheArgmaxLowestIdOnTies) {
  expect_probs(sampling_distribution(tenths(), {.temperature = 0}), {0, 0, 0, 1});
  TokenSampler greedy({.temperature = 0}, 1);
  EXPECT_EQ(greedy.sample_row(std::vector<float>{0.5f, 3, 3, -1}), 1);
}

TEST(Sampling, PaddedVocabularyRowsAreNeverChosen) {
  // Ids 3 and up are the embedding's padding: however large their logits, they get nothing.
  const std::vector<float> logits{0, std::log(3.0f), 0, 50, 50};
  expect_probs(sampling_distribution(logits, {.vocab_limit = 3}), {0.2, 0.6, 0.2, 0, 0});
  TokenSampler greedy({.temperature = 0, .vocab_limit = 3}, 1);
  EXPECT_EQ(greedy.sample_row(logits), 1);
}

TEST(Sampling, DrawsFollowTheDistribution) {
  TokenSampler sampler({.top_k = 3}, 1234);
  const auto logits = tenths();
  std::vector<int> counts(4, 0);
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) ++counts[static_cast<std::size_t>(sampler.sample_row(logits))];
  EXPECT_EQ(counts[0], 0);
  // Expected 2/9, 3/9, 4/9; a binomial standard deviation here is about 0.0025, allow 4 of them.
  EXPECT_NEAR(counts[1] / double(draws), 2 / 9.0, 0.01);
  EXPECT_NEAR(counts[2] / double(draws), 3 / 9.0, 0.01);
  EXPECT_NEAR(counts[3] / double(draws), 4 / 9.0, 0.01);
}

TEST(Sampling, TheSeedFixesTheDraws) {
  const auto logits = tenths();
  auto draw = [&](std::uint64_t seed) {
    TokenSampler s({}, seed);
    std::vector<std::int64_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample_row(logits));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampling, SamplesTheLastPositionOfEachRow) {
  // [B=2, T=2, V=3]: position 0 points elsewhere; the last positions' argmaxes are 2 and 0.
  auto logits = Tensor::from_vector<float>({9, 0, 0, 0, 0, 5, /**/ 0, 9, 0, 7, 1, 1}, {2, 2, 3});
  TokenSampler greedy({.temperature = 0}, 1);
  EXPECT_EQ(greedy.sample(logits), (std::vector<std::int64_t>{2, 0}));
  EXPECT_EQ(greedy.sample(Tensor::from_vector<float>({1, 4, 2}, {3})), (std::vector<std::int64_t>{1}));
}

TEST(Sampling, BadOptionsAndLogitsAreRefused) {
  EXPECT_THROW(sampling_distribution(tenths(), {.temperature = -1}), Error);
  EXPECT_THROW(sampling_distribution(tenths(), {.top_k = -2}), Error);
  EXPECT_THROW(sampling_distribution(tenths(), {.top_p = 0}), Error);
  EXPECT_THROW(sampling_distribution(tenths(), {.top_p = 1.5}), Error);
  EXPECT_THROW(sampling_distribution(std::vector<float>{0, NAN, 1}, {}), Error);
  EXPECT_THROW(sampling_distribution(std::vector<float>{-INFINITY, -INFINITY}, {}), Error);
  try {
    TokenSampler({.top_p = 2}, 0);
    FAIL() << "top_p 2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--top-p"), std::string::npos) << e.what();
  }
}

}  // namespace sampling_test
}  // namespace kiln::models
