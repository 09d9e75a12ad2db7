#pragma once
// Backend: what a device kind offers the layers above (ggml-style explicit interface).
// Tensors allocate, copy and synchronise only through this, so a new vendor is one new Backend.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kiln/runtime/device.h"
#include "kiln/runtime/stream.h"

namespace kiln {

struct DeviceProperties {
  std::string name;
  std::size_t total_memory = 0;
  std::size_t free_memory = 0;
  int compute_major = 0;  // compute capability; 0 on the CPU
  int compute_minor = 0;
  int multiprocessors = 0;  // SMs on a GPU, hardware threads on the CPU
};

struct MemoryStats {
  std::size_t allocated = 0;       // bytes handed out to tensors now
  std::size_t reserved = 0;        // bytes held from the driver (allocated + cached)
  std::size_t peak_allocated = 0;  // high-water mark of `allocated` since the last reset
  // What the live blocks were asked for, each request rounded to 512 B, and its high-water mark
  // since the last reset. The caching allocator splits its blocks to the rounded request, so this
  // equals `allocated` there; a backend whose blocks may be larger than asked reports less here.
  std::size_t requested = 0, peak_requested = 0;
  std::size_t device_allocations = 0;  // calls into the driver's allocator (cudaMalloc) so far
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual int device_count() const = 0;
  virtual DeviceProperties properties(int index) const = 0;

  // Memory from the backend's caching allocator. allocate(0) returns nullptr.
  virtual void* allocate(std::size_t bytes, int index) = 0;
  virtual void deallocate(void* ptr, int index) = 0;
  virtual MemoryStats memory_stats(int index) const = 0;
  virtual void reset_peak_memory(int index) = 0;
  // Returns cached, unused blocks to the driver.
  virtual void empty_cache(int index) = 0;

  // Copies between this backend's device `index` and the host or itself, in stream order.
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes, int index) = 0;
  virtual void copy_from_host(void* dst, const void* src, std::size_t bytes, int index) = 0;
  virtual void copy_on_device(void* dst, const void* src, std::size_t bytes, int index) = 0;
  virtual void memset_zero(void* dst, std::size_t bytes, int index) = 0;

  // Streams (runtime/stream.h). set_current_stream is per thread; a nullptr handle selects the
  // compute stream.
  virtual Stream current_stream(int index) const = 0;
  virtual void set_current_stream(Stream stream) = 0;
  virtual Stream compute_stream(int index) const = 0;
  virtual Stream pool_stream(int index, StreamPriority priority) = 0;
  virtual void synchronize_stream(Stream stream) = 0;
  virtual bool query_stream(Stream stream) = 0;
  // Waits for the current stream of device `index`.
  virtual void synchronize(int index) = 0;

  // Tells the caching allocator that the block at `ptr` (a pointer allocate() returned) is used by
  // work on `stream` as well as the stream it was allocated on: once freed, it is not reused until
  // `stream` has passed that point (PyTorch's record_stream). Without this, a block freed on the
  // compute stream could be handed out again while a side stream still reads it.
  // Memory allocate() did not return (wrapped from outside) is the caller's to keep alive: ignored.
  virtual void record_stream(void* ptr, Stream stream) = 0;
};

// The explicit backend registry. The CPU backend and (when built) the CUDA backend are added by
// register_builtin_backends(), which backends() calls once; nothing registers from static init.
class BackendRegistry {
 public:
  void add(std::unique_ptr<Backend> backend);
  bool has(DeviceKind kind) const;
  Backend& get(DeviceKind kind) const;  // throws naming the device kind if not built in

 private:
  std::unique_ptr<Backend> backends_[kNumDeviceKinds];
};

BackendRegistry& backends();
Backend& backend_for(Device device);
// Number of usable devices of a kind: 0 when the backend is not built or no device is present.
int device_count(DeviceKind kind);
void synchronize(Device device);

}  // namespace kiln
