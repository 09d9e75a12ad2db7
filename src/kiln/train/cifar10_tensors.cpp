#include "kiln/train/cifar10_tensors.h"

#include <algorithm>

#include "kiln/vision/cifar10_dataset.h"
#include "kiln/vision/cifar10_download.h"
#include "kiln/vision/image_transforms.h"

namespace kiln::train {

ImageSet load_cifar10(const std::filesystem::path& data_dir, bool train_split, Device device, std::int64_t limit,
                      bool download) {
  std::filesystem::path dir = data_dir;
  if (!vision::find_cifar10_batches(data_dir)) {
    KILN_CHECK(download,
               "CIFAR-10 not found under {} (expected cifar-10-batches-bin/); run `kiln data cifar10 "
               "--data-dir {}` or allow the download",
               data_dir.string(), data_dir.string());
    vision::Cifar10FetchOptions fetch;
    fetch.log = [](std::string_view line) { fmt::print(stderr, "{}\n", line); };
    dir = vision::ensure_cifar10(data_dir, fetch);
  }
  vision::Cifar10Dataset ds(dir, train_split ? vision::Cifar10Split::Train : vision::Cifar10Split::Test);
  std::int64_t n = limit > 0 ? std::min(limit, ds.size()) : ds.size();
  auto px = ds.images();
  ImageSet set;
  set.images = Tensor::from_host(px.data(), {n, 3, 32, 32}, DType::U8, device);
  auto labels = ds.labels_int64();
  labels.resize(static_cast<std::size_t>(n));
  set.labels = Tensor::from_vector(labels, {n}, device);
  return set;
}

vision::AugmentParams cifar10_normalization(const std::string& name) {
  vision::Normalization norm;
  if (name == "half")
    norm = vision::Normalization::half();
  else if (name == "cifar")
    norm = vision::Normalization::cifar10_stats();
  else
    KILN_FAIL("unknown normalization '{}': expected half or cifar", name);
  vision::AugmentParams p;
  for (int c = 0; c < 3; ++c) {
    p.mean[c] = norm.mean[static_cast<std::size_t>(c)];
    p.std[c] = norm.std[static_cast<std::size_t>(c)];
  }
  return p;
}

}  // namespace kiln::train
