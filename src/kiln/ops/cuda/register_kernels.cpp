// The CUDA kernel table. Each kernel family lives in its own ops/cuda/<family>.cu.
#include "kiln/ops/kernels.h"

namespace kiln::ops {

void register_cuda_kernels(Kernels& k) { (void)k; }

}  // namespace kiln::ops
