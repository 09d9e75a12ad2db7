#pragma once
// Helpers for CUDA host code: the current stream of a device and a scoped device switch.
#include "kiln/runtime/vendor/cuda.h"

namespace kiln {

// The stream Kiln's kernels on cuda:index run on (the current stream of this thread).
cudaStream_t cuda_stream(int index);

class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    cudaGetDevice(&previous_);
    if (previous_ != index) cudaSetDevice(index);
  }
  ~DeviceGuard() {
    int now = 0;
    cudaGetDevice(&now);
    if (now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace kiln
