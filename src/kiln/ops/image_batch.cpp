#include "kiln/ops/image_batch.h"

#include "kiln/ops/checks.h"
#include "kiln/ops/kernels.h"

namespace kiln::ops {

Tensor augment_images(const Tensor& images, const Tensor& indices, const AugmentParams& p) {
  check_same_device("augment_images", images, indices);
  KILN_CHECK(images.dtype() == DType::U8 && images.dim() == 4 && images.is_contiguous() && images.shape()[1] <= 4,
             "augment_images: images must be contiguous uint8 [N, C<=4, H, W], got {}", images.describe());
  KILN_CHECK(indices.dtype() == DType::I64 && indices.dim() == 1, "augment_images: indices must be int64 [B], got {}",
             indices.describe());
  KILN_CHECK(p.pad >= 0 && p.pad < images.shape()[2] && p.pad < images.shape()[3],
             "augment_images: padding {} is too large for {}x{} images", p.pad, images.shape()[2], images.shape()[3]);
  Tensor out = Tensor::empty({indices.shape()[0], images.shape()[1], images.shape()[2], images.shape()[3]}, DType::F32,
                             images.device());
  if (out.numel()) KILN_KERNEL(images.device(), augment_images)(images, indices.is_contiguous() ? indices : indices.contiguous(), out, p);
  return out;
}

}  // namespace kiln::ops
