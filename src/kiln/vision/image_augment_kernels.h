#pragma once
// The kernels of augment_images, one per backend (vision/cpu/, vision/cuda/), registered by
// register_image_ops() (vision/image_augment.h). Their type is vision::AugmentImagesKernel.
#include "kiln/tensor/tensor.h"
#include "kiln/vision/augment_params.h"

namespace kiln::vision {

namespace cpu {
void augment_images(const Tensor& images, const Tensor& indices, const Tensor& out, const AugmentParams& p);
}
#if KILN_WITH_CUDA
namespace cuda {
void augment_images(const Tensor& images, const Tensor& indices, const Tensor& out, const AugmentParams& p);
}
#endif

}  // namespace kiln::vision
