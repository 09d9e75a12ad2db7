#pragma once
// The per-image transforms of the usual CIFAR-10 recipes, on plain buffers:
//   ToTensor + Normalize(mean, std):  float = (byte / 255 - mean[c]) / std[c]
//   RandomCrop(32, padding=4):        zero-pad to 40x40, crop a random 32x32 window
//   RandomHorizontalFlip():           mirror left-right with probability 1/2
// Padding is zero *bytes*, normalised like any pixel (as torchvision pads the image before
// ToTensor/Normalize), so a padded pixel becomes -mean/std, not 0.
#include <cstdint>
#include <vector>

namespace kiln::vision {

struct Normalization {
  std::vector<float> mean;
  std::vector<float> std;

  // Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)): maps [0, 1] to [-1, 1] (the PyTorch tutorial's).
  static Normalization half();
  // CIFAR-10 training-set statistics per channel: mean (0.4914, 0.4822, 0.4465), std (0.2470, 0.2435, 0.2616).
  static Normalization cifar10_stats();

  // As one multiply-add per pixel: float = byte * scale[c] + bias[c].
  float scale(int channel) const { return 1.0f / (255.0f * std[static_cast<std::size_t>(channel)]); }
  float bias(int channel) const {
    return -mean[static_cast<std::size_t>(channel)] / std[static_cast<std::size_t>(channel)];
  }
};

struct AugmentOptions {
  bool random_crop = true;
  int padding = 4;  // the crop window moves by up to this many pixels each way
  bool horizontal_flip = true;
};

// What augmentation does to one image: output(y, x) = input(y + offset_y, x + offset_x), zero
// outside, then mirrored left-right when `flip`. Offsets are in [-padding, padding].
struct AugmentChoice {
  int offset_y = 0;
  int offset_x = 0;
  bool flip = false;
};

// The augmentation of sample `index` in `epoch`: a pure function of its arguments (seeded_random.h),
// so a GPU kernel can reproduce it. Draws: stream 0 the crop row, 1 the crop column, 2 the flip.
AugmentChoice choose_augmentation(std::uint64_t seed, std::int64_t epoch, std::int64_t index,
                                  const AugmentOptions& options);

// One image: `src` is channels x height x width bytes (planar), `dst` the same shape in float32.
void transform_image(const std::uint8_t* src, int channels, int height, int width, const AugmentChoice& choice,
                     const Normalization& normalization, float* dst);

}  // namespace kiln::vision
