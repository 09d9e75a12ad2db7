#include "kiln/vision/image_transforms.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "kiln/vision/seeded_random.h"

namespace kiln::vision {
namespace image_transforms_test {

std::vector<std::uint8_t> random_image(int c, int h, int w, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> image(std::size_t(c) * h * w);
  for (auto& v : image) v = static_cast<std::uint8_t>(rng() & 0xff);
  return image;
}

// The torchvision recipe spelled out: zero-pad by p, crop at (p + dy, p + dx), mirror, normalise.
std::vector<float> reference_transform(const std::vector<std::uint8_t>& src, int channels, int h, int w,
                                       const AugmentChoice& choice, const Normalization& n) {
  std::vector<float> out(src.size());
  for (int c = 0; c < channels; ++c) {
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        const int cropped_x = choice.flip ? w - 1 - x : x;
        const int sy = y + choice.offset_y, sx = cropped_x + choice.offset_x;
        const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
        const float byte = inside ? src[(std::size_t(c) * h + sy) * w + sx] : 0.0f;
        out[(std::size_t(c) * h + y) * w + x] = (byte / 255.0f - n.mean[std::size_t(c)]) / n.std[std::size_t(c)];
      }
    }
  }
  return out;
}

TEST(Normalization, HalfMapsZeroToMinusOneAndFullToOne) {
  auto image = std::vector<std::uint8_t>{0, 255, 128};
  std::vector<float> out(3);
  transform_image(image.data(), 3, 1, 1, {}, Normalization::half(), out.data());
  EXPECT_NEAR(out[0], -1.0f, 1e-6f);
  EXPECT_NEAR(out[1], 1.0f, 1e-6f);
  EXPECT_NEAR(out[2], (128.0f / 255.0f - 0.5f) / 0.5f, 1e-6f);
}

TEST(Normalization, Cifar10StatisticsArePerChannel) {
  auto n = Normalization::cifar10_stats();
  EXPECT_EQ(n.mean, (std::vector<float>{0.4914f, 0.4822f, 0.4465f}));
  EXPECT_EQ(n.std, (std::vector<float>{0.2470f, 0.2435f, 0.2616f}));
  auto image = std::vector<std::uint8_t>{51, 102, 204};
  std::vector<float> out(3);
  transform_image(image.data(), 3, 1, 1, {}, n, out.data());
  EXPECT_NEAR(out[0], (0.2f - 0.4914f) / 0.2470f, 1e-5f);
  EXPECT_NEAR(out[1], (0.4f - 0.4822f) / 0.2435f, 1e-5f);
  EXPECT_NEAR(out[2], (0.8f - 0.4465f) / 0.2616f, 1e-5f);
}

TEST(TransformImage, EveryCropOffsetAndFlipMatchesPadCropMirror) {
  for (auto [h, w] : {std::pair{32, 32}, std::pair{5, 7}}) {
    auto src = random_image(3, h, w, 11);
    auto n = Normalization::cifar10_stats();
    std::vector<float> out(src.size());
    for (int dy = -4; dy <= 4; ++dy) {
      for (int dx = -4; dx <= 4; ++dx) {
        for (bool flip : {false, true}) {
          AugmentChoice choice{dy, dx, flip};
          transform_image(src.data(), 3, h, w, choice, n, out.data());
          auto expected = reference_transform(src, 3, h, w, choice, n);
          for (std::size_t i = 0; i < out.size(); ++i) {
            ASSERT_NEAR(out[i], expected[i], 2e-5f)
                << h << "x" << w << " dy " << dy << " dx " << dx << " flip " << flip << " at " << i;
          }
        }
      }
    }
  }
}

TEST(ChooseAugmentation, IsAPureFunctionCoveringEveryOffsetAndBothFlips) {
  AugmentOptions options;
  std::set<int> ys, xs;
  int flips = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    auto a = choose_augmentation(42, 3, i, options);
    auto b = choose_augmentation(42, 3, i, options);
    ASSERT_EQ(a.offset_y, b.offset_y);
    ASSERT_EQ(a.offset_x, b.offset_x);
    ASSERT_EQ(a.flip, b.flip);
    ASSERT_GE(a.offset_y, -4);
    ASSERT_LE(a.offset_y, 4);
    ASSERT_GE(a.offset_x, -4);
    ASSERT_LE(a.offset_x, 4);
    ys.insert(a.offset_y);
    xs.insert(a.offset_x);
    flips += a.flip;
  }
  EXPECT_EQ(ys.size(), 9u);
  EXPECT_EQ(xs.size(), 9u);
  EXPECT_NEAR(double(flips) / n, 0.5, 0.02);

  int same = 0;
  for (int i = 0; i < 1000; ++i) {
    auto a = choose_augmentation(42, 3, i, options), b = choose_augmentation(42, 4, i, options);
    same += a.offset_y == b.offset_y && a.offset_x == b.offset_x && a.flip == b.flip;
  }
  EXPECT_LT(same, 50) << "epoch 3 and 4 draw (almost) the same augmentations";

  options = {false, 4, false};
  auto none = choose_augmentation(42, 3, 5, options);
  EXPECT_EQ(none.offset_y, 0);
  EXPECT_EQ(none.offset_x, 0);
  EXPECT_FALSE(none.flip);
}

TEST(ShuffledIndices, IsAPermutationThatDependsOnSeedAndEpoch) {
  auto a = shuffled_indices(1000, 1, 0);
  std::set<std::int64_t> unique(a.begin(), a.end());
  ASSERT_EQ(unique.size(), 1000u);
  EXPECT_EQ(*unique.begin(), 0);
  EXPECT_EQ(*unique.rbegin(), 999);
  EXPECT_EQ(a, shuffled_indices(1000, 1, 0));
  EXPECT_NE(a, shuffled_indices(1000, 1, 1));
  EXPECT_NE(a, shuffled_indices(1000, 2, 0));
  int fixed_points = 0;
  for (int i = 0; i < 1000; ++i) fixed_points += a[std::size_t(i)] == i;
  EXPECT_LT(fixed_points, 10);
}

}  // namespace image_transforms_test
}  // namespace kiln::vision
