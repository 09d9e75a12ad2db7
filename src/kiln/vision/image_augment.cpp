#include "kiln/vision/image_augment.h"

#include "kiln/ops/checks.h"
#include "kiln/vision/image_augment_kernels.h"

namespace kiln::vision {

void register_image_ops(ops::KernelRegistry& registry) {
  const auto op = registry.declare<AugmentImagesKernel>(kAugmentImagesOp);
  registry.add(op, DeviceKind::CPU, cpu::augment_images);
#if KILN_WITH_CUDA
  registry.add(op, DeviceKind::CUDA, cuda::augment_images);
#endif
}

ops::KernelOp<AugmentImagesKernel> augment_images_op() {
  static const ops::KernelOp<AugmentImagesKernel> op = [] {
    register_image_ops(ops::kernel_registry());
    return ops::kernel_registry().find<AugmentImagesKernel>(kAugmentImagesOp);
  }();
  return op;
}

namespace {
void check_augment_args(const Tensor& images, const Tensor& indices, const AugmentParams& p) {
  ops::check_same_device("augment_images", images, indices);
  KILN_CHECK(images.dtype() == DType::U8 && images.dim() == 4 && images.is_contiguous() && images.shape()[1] <= 4,
             "augment_images: images must be contiguous uint8 [N, C<=4, H, W], got {}", images.describe());
  KILN_CHECK(indices.dtype() == DType::I64 && indices.dim() == 1, "augment_images: indices must be int64 [B], got {}",
             indices.describe());
  KILN_CHECK(p.pad >= 0 && p.pad < images.shape()[2] && p.pad < images.shape()[3],
             "augment_images: padding {} is too large for {}x{} images", p.pad, images.shape()[2], images.shape()[3]);
}

void run(const Tensor& images, const Tensor& indices, const Tensor& out, const AugmentParams& p) {
  if (out.numel() == 0) return;
  const Tensor idx = indices.is_contiguous() ? indices : indices.contiguous();
  ops::kernel(augment_images_op(), images.device(), images.dtype())(images, idx, out, p);
}
}  // namespace

Tensor augment_images(const Tensor& images, const Tensor& indices, const AugmentParams& p) {
  check_augment_args(images, indices, p);
  Tensor out = Tensor::empty({indices.shape()[0], images.shape()[1], images.shape()[2], images.shape()[3]}, DType::F32,
                             images.device());
  run(images, indices, out, p);
  return out;
}

void augment_images_into(const Tensor& out, const Tensor& images, const Tensor& indices, const AugmentParams& p) {
  check_augment_args(images, indices, p);
  ops::check_same_device("augment_images", images, out);
  const Shape want{indices.shape()[0], images.shape()[1], images.shape()[2], images.shape()[3]};
  KILN_CHECK(out.dtype() == DType::F32 && out.is_contiguous() && out.shape() == want,
             "augment_images: out must be contiguous float32 {}, got {}", shape_str(want), out.describe());
  run(images, indices, out, p);
  out.storage()->bump_version();
}

}  // namespace kiln::vision
