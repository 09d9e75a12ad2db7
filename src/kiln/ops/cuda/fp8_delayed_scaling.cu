// TransformerEngine's DelayedScaling update on the device: one thread runs fp8::delayed_scaling_step
// (fp8_scaling.h) on one tensor's amax history, so the CPU reference and the GPU produce the same
// bits. The window is short (Megatron's default is 1, TE's 1024) and the step is a handful of
// microseconds, launched on the tensor's stream with no host synchronisation. The batched form
// runs up to kBatch tensors' steps (a thread each) in one launch: the cost of the update is the
// launch, so a transformer layer's dozen tensors share one.
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/fp8_cuda.h"
#include "kiln/ops/fp8_scaling.h"

namespace kiln::ops::cuda {

namespace {

__global__ void delayed_scaling_kernel(float* history, std::int64_t len, float* scale, float* scale_inv,
                                       bool most_recent, float scaled_max) {
  fp8::delayed_scaling_step(history, len, scale, scale_inv, most_recent, scaled_max);
}

constexpr int kBatch = 32;

// Passed by value (about 1.2 KB of kernel parameters): no device-side table to upload.
struct Batch {
  float* history[kBatch];
  float* scale[kBatch];
  float* scale_inv[kBatch];
  std::int64_t len[kBatch];
  float scaled_max[kBatch];
  int count;
};

__global__ void delayed_scaling_many_kernel(Batch b, bool most_recent) {
  const int i = threadIdx.x;
  if (i < b.count)
    fp8::delayed_scaling_step(b.history[i], b.len[i], b.scale[i], b.scale_inv[i], most_recent, b.scaled_max[i]);
}

}  // namespace

void fp8_delayed_scaling_update_many(const std::vector<Fp8DelayedScalingRef>& states, bool most_recent) {
  Launch l(states.front().amax_history);
  for (std::size_t first = 0; first < states.size(); first += kBatch) {
    Batch b{};
    b.count = static_cast<int>(std::min<std::size_t>(kBatch, states.size() - first));
    for (int i = 0; i < b.count; ++i) {
      const Fp8DelayedScalingRef& s = states[first + static_cast<std::size_t>(i)];
      b.history[i] = static_cast<float*>(s.amax_history.data_ptr());
      b.scale[i] = static_cast<float*>(s.scale.data_ptr());
      b.scale_inv[i] = static_cast<float*>(s.scale_inv.data_ptr());
      b.len[i] = s.amax_history.numel();
      b.scaled_max[i] = s.scaled_max;
    }
    delayed_scaling_many_kernel<<<1, kBatch, 0, l.stream>>>(b, most_recent);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

void fp8_delayed_scaling_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inv, bool most_recent,
                                float scaled_max) {
  Launch l(history);
  delayed_scaling_kernel<<<1, 1, 0, l.stream>>>(static_cast<float*>(history.data_ptr()), history.numel(),
                                                static_cast<float*>(scale.data_ptr()),
                                                static_cast<float*>(scale_inv.data_ptr()), most_recent, scaled_max);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::ops::cuda
