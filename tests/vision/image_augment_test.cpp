#include "kiln/vision/image_augment.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kiln/ops/kernels.h"
#include "kiln/runtime/backend.h"

namespace kiln {
namespace image_augment_test {

Tensor ramp_images(std::int64_t n) {
  std::vector<std::uint8_t> px(static_cast<std::size_t>(n * 3 * 4 * 4));
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>(i % 251);
  return Tensor::from_vector(px, {n, 3, 4, 4});
}

TEST(AugmentImages, WithoutAugmentationItGathersAndNormalises) {
  Tensor images = ramp_images(3);
  vision::AugmentParams p;
  for (int c = 0; c < 3; ++c) p.mean[c] = 0.5f, p.std[c] = 0.5f;
  Tensor out = vision::augment_images(images, Tensor::from_vector<std::int64_t>({2, 0}), p);
  ASSERT_EQ(out.shape(), (Shape{2, 3, 4, 4}));
  auto src = images.to_vector<std::uint8_t>();
  auto v = out.to_vector<float>();
  for (std::size_t i = 0; i < 48; ++i) {
    EXPECT_NEAR(v[i], (src[2 * 48 + i] / 255.0f - 0.5f) / 0.5f, 1e-6);
    EXPECT_NEAR(v[48 + i], (src[i] / 255.0f - 0.5f) / 0.5f, 1e-6);
  }
}

TEST(AugmentImages, CropAndFlipAreDeterministicAndZeroPadded) {
  Tensor images = ramp_images(8);
  vision::AugmentParams p;
  p.pad = 2;
  p.flip = true;
  p.seed = 7;
  Tensor idx = Tensor::arange(0, 8, 1, DType::I64);
  auto a = vision::augment_images(images, idx, p).to_vector<float>();
  auto b = vision::augment_images(images, idx, p).to_vector<float>();
  EXPECT_EQ(a, b);
  p.seed = 8;
  EXPECT_NE(a, vision::augment_images(images, idx, p).to_vector<float>());
  // Every output value is either zero padding or one of the source pixels of the same image/plane.
  auto src = images.to_vector<std::uint8_t>();
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::size_t plane = i / 16;
    bool found = a[i] == 0.0f;
    for (std::size_t j = 0; j < 16 && !found; ++j) found = std::abs(a[i] - src[plane * 16 + j] / 255.0f) < 1e-6f;
    EXPECT_TRUE(found) << "element " << i;
  }
}

TEST(AugmentImages, CudaMatchesCpu) {
  if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  Tensor images = ramp_images(16);
  vision::AugmentParams p;
  p.pad = 1;
  p.flip = true;
  p.seed = 3;
  for (int c = 0; c < 3; ++c) p.mean[c] = 0.4f, p.std[c] = 0.25f;
  Tensor idx = Tensor::from_vector<std::int64_t>({5, 1, 15, 0, 7});
  auto cpu = vision::augment_images(images, idx, p).to_vector<float>();
  auto gpu = vision::augment_images(images.to(Device::cuda()), idx.to(Device::cuda()), p).to_vector<float>();
  ASSERT_EQ(cpu.size(), gpu.size());
  for (std::size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(cpu[i], gpu[i], 1e-6) << i;
}

// augment_images is vision's op family: it enters the kernel registry when vision registers it,
// after the built-in ops, and a registry of one's own can hold it too.
TEST(AugmentImages, RegistersAsItsOwnOpFamily) {
  const auto op = vision::augment_images_op();
  EXPECT_GE(op.id, ops::kNumBuiltinOps);
  EXPECT_EQ(vision::augment_images_op().id, op.id);
  EXPECT_TRUE(ops::kernel_registry().has_kernel(vision::kAugmentImagesOp, DeviceKind::CPU, DType::U8));
  ops::KernelRegistry fresh;
  EXPECT_FALSE(fresh.find_id(vision::kAugmentImagesOp).has_value());
  vision::register_image_ops(fresh);
  EXPECT_TRUE(fresh.has_kernel(vision::kAugmentImagesOp, DeviceKind::CPU, DType::U8));
  EXPECT_THROW(vision::register_image_ops(fresh), Error);  // each kernel once
}

}  // namespace image_augment_test
}  // namespace kiln
