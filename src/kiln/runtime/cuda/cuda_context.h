#pragma once
// Helpers for CUDA host code: the current stream of a device and a scoped device switch.
#include <atomic>

#include "kiln/runtime/vendor/cuda.h"

namespace kiln {

class CachingAllocator;

// The stream Kiln's kernels on cuda:index run on (the current stream of this thread).
cudaStream_t cuda_stream(int index);
// The caching allocator of cuda:index (CudaGraph gives each capture a private pool of it).
CachingAllocator& cuda_caching_allocator(int index);

// While alive, lets this thread make calls that an ongoing stream capture would refuse
// (cudaMalloc, cudaHostAlloc). They are not stream work, so this is safe as long as the memory is
// not freed while a graph may use it (PyTorch's allocator does the same during capture).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { ok_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess; }
  ~RelaxedCaptureMode() {
    if (ok_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool ok_ = false;
};

namespace detail {
// Set by the CUDA backend when the process sees exactly one device. The current device of every
// thread is then device 0 (no other index is valid), so a guard for device 0 has nothing to check
// or switch. Atomic because guards may run on threads that never touched the registry; relaxed
// loads are plain loads on x86.
inline std::atomic<bool> g_cuda_single_device{false};
// Set once Kiln's CUDA allocator has handed out device memory. Until then no buffer can be device
// memory of Kiln's, so code that routes buffers by where they live (dist's NCCL path) need not ask
// the CUDA runtime, which would create a context on a GPU that a CPU-only run never uses.
inline std::atomic<bool> g_cuda_memory_allocated{false};
}  // namespace detail

class DeviceGuard {
 public:
  // Every kernel launch takes a guard. With one visible device it makes no runtime call at all;
  // otherwise one cudaGetDevice, and the destructor only restores when this guard switched devices
  // (nested guards restore their own switch), so the same-device case costs no second call.
  explicit DeviceGuard(int index) {
    if (index == 0 && detail::g_cuda_single_device.load(std::memory_order_relaxed)) return;
    cudaGetDevice(&previous_);
    switched_ = previous_ != index;
    if (switched_) cudaSetDevice(index);
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace kiln
