#pragma once
// The parameters of augment_images (vision/image_augment.h), shared by its wrapper and kernels.
#include <cstdint>

namespace kiln::vision {

// Training-time image batch preparation (random crop with zero-byte padding, horizontal flip,
// normalisation of every pixel, padding included, as torchvision does), drawn from
// Philox(seed, offset + row) so every device makes the same batch.
struct AugmentParams {
  int pad = 0;        // crop offsets are uniform in [-pad, pad] on each axis
  bool flip = false;  // mirror horizontally with probability 1/2
  float mean[4] = {0, 0, 0, 0};
  float std[4] = {1, 1, 1, 1};
  std::uint64_t seed = 0, offset = 0;
};

}  // namespace kiln::vision
