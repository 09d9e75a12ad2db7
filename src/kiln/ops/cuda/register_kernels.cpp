// The CUDA kernel table. Each kernel family lives in its own ops/cuda/<family>.cu.
#include "kiln/ops/kernels.h"

namespace kiln::ops {

namespace cuda {
void augment_images(const Tensor& images, const Tensor& indices, const Tensor& out, const AugmentParams& p);
}

void register_cuda_kernels(Kernels& k) { k.augment_images = cuda::augment_images; }

}  // namespace kiln::ops
