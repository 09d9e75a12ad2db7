#pragma once
// Building a training batch from a uint8 image dataset held on the device (the whole-dataset
// mode: no host-to-device copy per step).
#include "kiln/ops/op_kinds.h"
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

// images uint8 [N, C, H, W] (C <= 4), indices int64 [B] on the same device -> float32 [B, C, H, W].
Tensor augment_images(const Tensor& images, const Tensor& indices, const AugmentParams& p);
// The same into an existing contiguous float32 [B, C, H, W] tensor (a CUDA graph's static input).
void augment_images_into(const Tensor& out, const Tensor& images, const Tensor& indices, const AugmentParams& p);

}  // namespace kiln::ops
