// The CPU backend: host memory through the caching allocator (64-byte aligned for SIMD loads).
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "kiln/runtime/backend.h"
#include "kiln/runtime/caching_allocator.h"
#include "kiln/runtime/error.h"

namespace kiln {
namespace {

std::size_t host_memory_field(const char* field) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == field) return kib * 1024;
  }
  return 0;
}

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "cpu";
}

class CpuBackend final : public Backend {
 public:
  CpuBackend()
      : allocator_(
            "cpu", [](std::size_t n) { return std::aligned_alloc(64, (n + 63) / 64 * 64); },
            [](void* p) { std::free(p); }, [] { return host_memory_field("MemAvailable:"); }) {}

  DeviceKind kind() const override { return DeviceKind::CPU; }
  int device_count() const override { return 1; }
  DeviceProperties properties(int) const override {
    DeviceProperties p;
    p.name = cpu_model_name();
    p.total_memory = host_memory_field("MemTotal:");
    p.free_memory = host_memory_field("MemAvailable:");
    p.multiprocessors = static_cast<int>(std::thread::hardware_concurrency());
    return p;
  }
  void* allocate(std::size_t bytes, int) override { return allocator_.allocate(bytes); }
  void deallocate(void* ptr, int) override { allocator_.deallocate(ptr); }
  MemoryStats memory_stats(int) const override { return allocator_.stats(); }
  void reset_peak_memory(int) override { allocator_.reset_peak(); }
  void empty_cache(int) override { allocator_.empty_cache(); }
  void copy_to_host(void* dst, const void* src, std::size_t n, int) override { std::memcpy(dst, src, n); }
  void copy_from_host(void* dst, const void* src, std::size_t n, int) override { std::memcpy(dst, src, n); }
  void copy_on_device(void* dst, const void* src, std::size_t n, int) override { std::memmove(dst, src, n); }
  void memset_zero(void* dst, std::size_t n, int) override { std::memset(dst, 0, n); }
  // The CPU runs each operation to completion on the calling thread: one stream, always idle.
  Stream current_stream(int) const override { return {Device::cpu(), nullptr}; }
  void set_current_stream(Stream) override {}
  Stream compute_stream(int) const override { return {Device::cpu(), nullptr}; }
  Stream pool_stream(int, StreamPriority) override { return {Device::cpu(), nullptr}; }
  void synchronize_stream(Stream) override {}
  bool query_stream(Stream) override { return true; }
  void synchronize(int) override {}
  // Host memory is never in use by queued work once a call returns: nothing to defer.
  void record_stream(void*, Stream) override {}

 private:
  CachingAllocator allocator_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace kiln
