#include "kiln/te/cuda/device_pointer_table.h"

namespace kiln::te::cuda {

namespace {

// Kernel parameters are limited to 4 KiB (without the large-parameter opt-in): 496 pointers and the
// count fit with room to spare.
constexpr int kPerLaunch = 496;
struct Chunk {
  const void* ptr[kPerLaunch];
  int count;
};
static_assert(sizeof(Chunk) + sizeof(void**) <= 4096);

__global__ void write_pointers_kernel(Chunk chunk, void** out) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < chunk.count) out[i] = const_cast<void*>(chunk.ptr[i]);
}

}  // namespace

void write_device_pointer_table(const void* const* host, std::size_t count, void** device, cudaStream_t stream) {
  for (std::size_t done = 0; done < count; done += kPerLaunch) {
    Chunk chunk{};
    const std::size_t n = count - done < kPerLaunch ? count - done : kPerLaunch;
    for (std::size_t i = 0; i < n; ++i) chunk.ptr[i] = host[done + i];
    chunk.count = static_cast<int>(n);
    write_pointers_kernel<<<(kPerLaunch + 127) / 128, 128, 0, stream>>>(chunk, device + done);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace kiln::te::cuda
