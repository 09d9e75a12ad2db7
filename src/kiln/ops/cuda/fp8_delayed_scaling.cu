// TransformerEngine's DelayedScaling update on the device: one thread runs fp8::delayed_scaling_step
// (fp8_scaling.h) on one tensor's amax history, so the CPU reference and the GPU produce the same
// bits. The window is short (Megatron's default is 1, TE's 1024) and the step is a handful of
// microseconds, launched on the tensor's stream with no host synchronisation.
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/fp8_cuda.h"
#include "kiln/ops/fp8_scaling.h"

namespace kiln::ops::cuda {

namespace {

__global__ void delayed_scaling_kernel(float* history, std::int64_t len, float* scale, float* scale_inv,
                                       bool most_recent, float scaled_max) {
  fp8::delayed_scaling_step(history, len, scale, scale_inv, most_recent, scaled_max);
}

}  // namespace

void fp8_delayed_scaling_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inv, bool most_recent,
                                float scaled_max) {
  Launch l(history);
  delayed_scaling_kernel<<<1, 1, 0, l.stream>>>(static_cast<float*>(history.data_ptr()), history.numel(),
                                                static_cast<float*>(scale.data_ptr()),
                                                static_cast<float*>(scale_inv.data_ptr()), most_recent, scaled_max);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::ops::cuda
