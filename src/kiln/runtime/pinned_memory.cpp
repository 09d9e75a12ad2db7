#include "kiln/runtime/pinned_memory.h"

#include <cstdlib>

#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"
#if KILN_WITH_CUDA
#include "kiln/runtime/vendor/cuda.h"
#endif

namespace kiln {

void PinnedDeleter::operator()(void* p) const {
  if (!p) return;
#if KILN_WITH_CUDA
  if (pinned) {
    cudaFreeHost(p);
    return;
  }
#endif
  std::free(p);
}

PinnedBuffer allocate_pinned(std::size_t bytes) {
#if KILN_WITH_CUDA
  if (device_count(DeviceKind::CUDA) > 0) {
    void* p = nullptr;
    KILN_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    return PinnedBuffer(p, PinnedDeleter{true});
  }
#endif
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  KILN_CHECK(p || bytes == 0, "out of host memory: tried to allocate {} bytes of pinned memory", bytes);
  return PinnedBuffer(p, PinnedDeleter{false});
}

}  // namespace kiln
