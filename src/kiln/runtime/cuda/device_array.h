#pragma once
// A device array of T from the CUDA caching allocator, zeroed, freed back to it when destroyed:
// the plain owning buffer that engines outside the tensor layer (hpc/) keep their state in.
#include <cstddef>
#include <utility>

#include "kiln/runtime/backend.h"

namespace kiln {

template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(int device, std::size_t n) : device_(device), size_(n) {
    if (n == 0) return;
    auto& backend = backend_for(Device::cuda(device));
    data_ = static_cast<T*>(backend.allocate(n * sizeof(T), device));
    backend.memset_zero(data_, n * sizeof(T), device);
  }
  ~DeviceArray() {
    if (data_) backend_for(Device::cuda(device_)).deallocate(data_, device_);
  }
  DeviceArray(DeviceArray&& o) noexcept
      : device_(o.device_), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  T* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  int device_ = 0;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kiln
