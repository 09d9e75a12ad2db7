#include "kiln/runtime/event.h"

#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"
#if KILN_WITH_CUDA
#include "kiln/runtime/cuda/cuda_context.h"
#endif

namespace kiln {

Event::Event(Device device) : device_(device) {
#if KILN_WITH_CUDA
  if (device.is_cuda()) {
    DeviceGuard guard(device.index);
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreate(&e));
    handle_ = e;
  }
#endif
}

Event::~Event() {
#if KILN_WITH_CUDA
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
#endif
}

void Event::record() {
#if KILN_WITH_CUDA
  if (handle_) {
    KILN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), cuda_stream(device_.index)));
    return;
  }
#endif
  host_time_ = std::chrono::steady_clock::now();
}

void Event::synchronize() {
#if KILN_WITH_CUDA
  if (handle_) KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
#endif
}

double Event::elapsed_ms(const Event& start) {
  KILN_CHECK(start.device_ == device_, "Event::elapsed_ms: events on {} and {}", start.device_.str(), device_.str());
#if KILN_WITH_CUDA
  if (handle_) {
    synchronize();
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_), static_cast<cudaEvent_t>(handle_)));
    return ms;
  }
#endif
  return std::chrono::duration<double, std::milli>(host_time_ - start.host_time_).count();
}

}  // namespace kiln
