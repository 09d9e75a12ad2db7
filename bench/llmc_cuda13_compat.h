// Force-included (nvcc -include) when bench/llmc_peer.sh builds llm.c's train_gpt2cu with CUDA 13.
// CUDA 13 dropped the cudaMemAdvise overload that takes a device ordinal (only the cudaMemLocation
// form is left), and llm.c (llmc/cuda_utils.cuh, cudaMallocConditionallyManaged) still calls
// cudaMemAdvise(ptr, bytes, advice, cudaCpuDeviceId). This overload restores the old call's meaning
// so llm.c's sources compile unchanged. That path runs only when cudaMalloc fails (llm.c then falls
// back to managed memory), which GPT-2 124M at B16 T1024 never does on an H200.
#pragma once
#include <cuda_runtime.h>

#if defined(CUDART_VERSION) && CUDART_VERSION >= 13000
static inline cudaError_t cudaMemAdvise(const void* ptr, size_t bytes, cudaMemoryAdvise advice, int device) {
  cudaMemLocation location{};
  location.type = device == cudaCpuDeviceId ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
  location.id = device == cudaCpuDeviceId ? 0 : device;
  return cudaMemAdvise(ptr, bytes, advice, location);
}
#endif
