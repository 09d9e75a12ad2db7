#include "kiln/vision/image_transforms.h"

#include <algorithm>

#include "kiln/runtime/error.h"
#include "kiln/vision/seeded_random.h"

namespace kiln::vision {

Normalization Normalization::half() { return {{0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}}; }

Normalization Normalization::cifar10_stats() { return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}}; }

AugmentChoice choose_augmentation(std::uint64_t seed, std::int64_t epoch, std::int64_t index,
                                  const AugmentOptions& options) {
  AugmentChoice choice;
  if (options.random_crop && options.padding > 0) {
    const auto span = static_cast<std::uint64_t>(2 * options.padding + 1);
    choice.offset_y = static_cast<int>(bounded(sample_random_bits(seed, epoch, index, 0), span)) - options.padding;
    choice.offset_x = static_cast<int>(bounded(sample_random_bits(seed, epoch, index, 1), span)) - options.padding;
  }
  if (options.horizontal_flip) choice.flip = (sample_random_bits(seed, epoch, index, 2) >> 63) != 0;
  return choice;
}

void transform_image(const std::uint8_t* src, int channels, int height, int width, const AugmentChoice& choice,
                     const Normalization& normalization, float* dst) {
  KILN_CHECK(normalization.mean.size() == std::size_t(channels) && normalization.std.size() == std::size_t(channels),
             "normalization has {} means and {} stds for {}-channel images", normalization.mean.size(),
             normalization.std.size(), channels);
  const int ox = choice.offset_x;
  // Output columns [x_begin, x_end) read inside the source row; the rest is padding. Without a
  // flip output x reads source x + ox; with one it reads source (width - 1 - x) + ox.
  const int x_begin = choice.flip ? std::max(0, ox) : std::max(0, -ox);
  const int x_end = choice.flip ? std::min(width, width + ox) : std::min(width, width - ox);
  for (int c = 0; c < channels; ++c) {
    const float scale = normalization.scale(c);
    const float bias = normalization.bias(c);  // a zero byte (padding) normalised
    const std::uint8_t* plane = src + std::size_t(c) * height * width;
    for (int y = 0; y < height; ++y) {
      float* out = dst + (std::size_t(c) * height + y) * width;
      const int sy = y + choice.offset_y;
      if (sy < 0 || sy >= height || x_begin >= x_end) {
        std::fill(out, out + width, bias);
        continue;
      }
      const std::uint8_t* row = plane + std::size_t(sy) * width;
      std::fill(out, out + x_begin, bias);
      if (choice.flip) {
        const int mirror = width - 1 + ox;
        for (int x = x_begin; x < x_end; ++x) out[x] = float(row[mirror - x]) * scale + bias;
      } else {
        for (int x = x_begin; x < x_end; ++x) out[x] = float(row[x + ox]) * scale + bias;
      }
      std::fill(out + x_end, out + width, bias);
    }
  }
}

}  // namespace kiln::vision
