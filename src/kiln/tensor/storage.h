#pragma once
// Storage: a block of device memory shared by a tensor and its views. It owns the version counter
// that autograd uses to detect in-place changes to saved tensors.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kiln/runtime/device.h"

namespace kiln {

class Storage {
 public:
  // Allocates `bytes` on `device` from its backend's caching allocator.
  Storage(std::size_t bytes, Device device);
  // Wraps memory Kiln does not own (for from_blob); the caller keeps it alive.
  Storage(void* external, std::size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  std::uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_;
  bool owned_ = true;
  std::uint64_t version_ = 0;
};

}  // namespace kiln
