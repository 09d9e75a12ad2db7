#pragma once
// Host-side helpers shared by the CUDA kernel files (.cu and the cuBLAS/cuDNN .cpp files).
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "kiln/runtime/backend.h"
#include "kiln/runtime/vendor/cuda.h"

namespace kiln::ops::cuda {

struct DeviceInfo {
  int sms = 132;
  int max_threads_per_sm = 2048;
  std::size_t shared_per_block_optin = 48 * 1024;
};
// Cached per device (no cudaGetDeviceProperties per call).
const DeviceInfo& device_info(int index);

// Whether environment variable `name` is set to something other than "" or "0".
inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// KILN_ALLOW_TF32=1: f32 matmuls and convolutions may use TF32 tensor cores (read once; the
// default is true FP32, as PyTorch's allow_tf32=False).
inline bool allow_tf32() {
  static const bool on = env_flag("KILN_ALLOW_TF32");
  return on;
}

// A scratch buffer from the device's caching allocator, released (back to the cache) at scope end.
// Safe with the single compute stream: later users of the block are ordered after our kernels.
// Never calls cudaMalloc once the cache holds a block of the size (so CUDA graph capture works
// after a warm-up step).
class Scratch {
 public:
  Scratch(std::size_t bytes, int index) : index_(index) {
    ptr_ = bytes ? backend_for(Device::cuda(index)).allocate(bytes, index) : nullptr;
  }
  ~Scratch() {
    if (ptr_) backend_for(Device::cuda(index_)).deallocate(ptr_, index_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* ptr() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  int index_;
};

}  // namespace kiln::ops::cuda
