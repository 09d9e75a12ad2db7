#include "kiln/runtime/event.h"

#include <utility>

#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"
#if KILN_WITH_CUDA
#include "kiln/runtime/cuda/cuda_context.h"
#endif

namespace kiln {

Event::Event(Device device, bool timing) : device_(device), timing_(timing) {
#if KILN_WITH_CUDA
  if (device.is_cuda()) {
    DeviceGuard guard(device.index);
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    handle_ = e;
  }
#endif
}

Event::~Event() { release(); }

Event::Event(Event&& other) noexcept
    : device_(other.device_),
      timing_(other.timing_),
      handle_(std::exchange(other.handle_, nullptr)),
      host_time_(other.host_time_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    timing_ = other.timing_;
    handle_ = std::exchange(other.handle_, nullptr);
    host_time_ = other.host_time_;
  }
  return *this;
}

void Event::release() {
#if KILN_WITH_CUDA
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
#endif
  handle_ = nullptr;
}

void Event::record() { record(Stream::current(device_)); }

void Event::record(const Stream& stream) {
  KILN_CHECK(stream.device == device_, "Event::record: the event is on {} but the stream is on {}", device_.str(),
             stream.device.str());
#if KILN_WITH_CUDA
  if (handle_) {
    DeviceGuard guard(device_.index);
    KILN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream.handle)));
    return;
  }
#endif
  host_time_ = std::chrono::steady_clock::now();
}

void Event::wait(const Stream& stream) const {
  KILN_CHECK(stream.device == device_, "Event::wait: the event is on {} but the stream is on {}", device_.str(),
             stream.device.str());
#if KILN_WITH_CUDA
  if (handle_) {
    DeviceGuard guard(device_.index);
    KILN_CUDA_CHECK(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle), static_cast<cudaEvent_t>(handle_), 0));
  }
#endif
  (void)stream;
}

bool Event::query() const {
#if KILN_WITH_CUDA
  if (handle_) {
    const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: the work is still running
      return false;
    }
    KILN_CUDA_CHECK(status);
  }
#endif
  return true;
}

void Event::synchronize() const {
#if KILN_WITH_CUDA
  if (handle_) KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
#endif
}

double Event::elapsed_ms(const Event& start) const {
  KILN_CHECK(start.device_ == device_, "Event::elapsed_ms: events on {} and {}", start.device_.str(), device_.str());
  KILN_CHECK(timing_ && start.timing_, "Event::elapsed_ms: both events must be made with timing = true");
#if KILN_WITH_CUDA
  if (handle_) {
    synchronize();
    float ms = 0;
    KILN_CUDA_CHECK(
        cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_), static_cast<cudaEvent_t>(handle_)));
    return ms;
  }
#endif
  return std::chrono::duration<double, std::milli>(host_time_ - start.host_time_).count();
}

}  // namespace kiln
