#pragma once
// Vector: a buffer of doubles on one device (host memory for the CPU engines, GPU memory for the
// CUDA engine), from the device's caching allocator. Move-only; the length covers rows and halo.
#include <cstddef>

#include "kiln/runtime/device.h"

namespace kiln::hpcg {

class Vector {
 public:
  Vector() = default;
  Vector(Device device, std::size_t size);
  ~Vector();
  Vector(Vector&& other) noexcept;
  Vector& operator=(Vector&& other) noexcept;
  Vector(const Vector&) = delete;
  Vector& operator=(const Vector&) = delete;

  double* data() { return data_; }
  const double* data() const { return data_; }
  std::size_t size() const { return size_; }
  Device device() const { return device_; }

 private:
  void release();
  Device device_{};
  double* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kiln::hpcg
