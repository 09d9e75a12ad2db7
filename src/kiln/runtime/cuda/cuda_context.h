#pragma once
// Helpers for CUDA host code: the current stream of a device and a scoped device switch.
#include "kiln/runtime/vendor/cuda.h"

namespace kiln {

// The stream Kiln's kernels on cuda:index run on (the current stream of this thread).
cudaStream_t cuda_stream(int index);

class DeviceGuard {
 public:
  // One cudaGetDevice per guard (every kernel launch takes one): the destructor only restores when
  // this guard switched devices (nested guards restore their own switch), so the common
  // same-device case costs no second runtime call.
  explicit DeviceGuard(int index) {
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
