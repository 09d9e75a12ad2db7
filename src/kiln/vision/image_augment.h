#pragma once
// Building a training batch from a uint8 image dataset held on the device (the whole-dataset
// mode: no host-to-device copy per step). augment_images is an op family of vision/, not of the
// core ops: its kernels (vision/cpu/, vision/cuda/) enter the kernel registry through
// register_image_ops().
#include "kiln/ops/kernel_registry.h"
#include "kiln/tensor/tensor.h"
#include "kiln/vision/augment_params.h"

namespace kiln::vision {

// images uint8 [N, C, H, W] contiguous, indices int64 [B] contiguous, out f32 [B, C, H, W]
// contiguous: out[i] = normalise(augment(images[indices[i]])) (see AugmentParams).
using AugmentImagesKernel = void(const Tensor& images, const Tensor& indices, const Tensor& out,
                                 const AugmentParams& p);
inline constexpr const char* kAugmentImagesOp = "augment_images";

// Registers the family's kernels (CPU, and CUDA in a CUDA build) in `registry`.
void register_image_ops(ops::KernelRegistry& registry);
// The op in the process-wide registry, registering the family there on the first call (so the
// wrappers below and the test harness need no setup; later calls return the same handle).
ops::KernelOp<AugmentImagesKernel> augment_images_op();

// images uint8 [N, C, H, W] (C <= 4), indices int64 [B] on the same device -> float32 [B, C, H, W].
Tensor augment_images(const Tensor& images, const Tensor& indices, const AugmentParams& p);
// The same into an existing contiguous float32 [B, C, H, W] tensor (a CUDA graph's static input).
void augment_images_into(const Tensor& out, const Tensor& images, const Tensor& indices, const AugmentParams& p);

}  // namespace kiln::vision
