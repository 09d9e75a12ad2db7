#include "kiln/hpc/hpcg/vector.h"

#include <utility>

#include "kiln/runtime/backend.h"

namespace kiln::hpcg {

Vector::Vector(Device device, std::size_t size) : device_(device), size_(size) {
  auto& backend = backend_for(device);
  data_ = static_cast<double*>(backend.allocate(size * sizeof(double), device.index));
  backend.memset_zero(data_, size * sizeof(double), device.index);
}

Vector::~Vector() { release(); }

Vector::Vector(Vector&& other) noexcept
    : device_(other.device_), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

Vector& Vector::operator=(Vector&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void Vector::release() {
  if (data_) backend_for(device_).deallocate(data_, device_.index);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace kiln::hpcg
