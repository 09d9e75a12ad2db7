// The CUDA backend: one caching allocator and one non-blocking compute stream per device. Kiln's
// kernels run on the device's current stream (never the legacy default stream, so whole training
// steps can be captured into CUDA graphs).
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "kiln/runtime/backend.h"
#include "kiln/runtime/caching_allocator.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/vendor/cuda.h"

namespace kiln {
namespace {

std::size_t free_device_bytes(int index) {
  DeviceGuard guard(index);
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return free;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    int count = 0;
    // No driver or no GPU: the backend exists (the build has it) with zero devices.
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();
      count = 0;
    }
    for (int i = 0; i < count; ++i) devices_.emplace_back();
    for (int i = 0; i < count; ++i) {
      devices_[i].allocator = std::make_unique<CachingAllocator>(
          Device::cuda(i).str(),
          [i](std::size_t n) -> void* {
            DeviceGuard guard(i);
            // During graph capture the caching allocator's private pool may need new memory:
            // cudaMalloc is not stream work and pool memory is never freed while the graph lives.
            RelaxedCaptureMode relaxed;
            void* p = nullptr;
            if (cudaMalloc(&p, n) != cudaSuccess) {
              (void)cudaGetLastError();
              return nullptr;
            }
            return p;
          },
          [i](void* p) {
            DeviceGuard guard(i);
            cudaFree(p);
          },
          [i] { return free_device_bytes(i); });
    }
  }

  DeviceKind kind() const override { return DeviceKind::CUDA; }
  int device_count() const override { return static_cast<int>(devices_.size()); }

  DeviceProperties properties(int index) const override {
    cudaDeviceProp prop{};
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    DeviceProperties p;
    p.name = prop.name;
    p.total_memory = prop.totalGlobalMem;
    p.free_memory = free_device_bytes(index);
    p.compute_major = prop.major;
    p.compute_minor = prop.minor;
    p.multiprocessors = prop.multiProcessorCount;
    return p;
  }

  void* allocate(std::size_t bytes, int index) override { return devices_.at(index).allocator->allocate(bytes); }
  void deallocate(void* ptr, int index) override { devices_.at(index).allocator->deallocate(ptr); }
  MemoryStats memory_stats(int index) const override { return devices_.at(index).allocator->stats(); }
  void reset_peak_memory(int index) override { devices_.at(index).allocator->reset_peak(); }
  void empty_cache(int index) override { devices_.at(index).allocator->empty_cache(); }

  void copy_to_host(void* dst, const void* src, std::size_t n, int index) override {
    DeviceGuard guard(index);
    cudaStream_t s = stream(index);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s));
    // The host reads dst right after: the copy must be complete.
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  void copy_from_host(void* dst, const void* src, std::size_t n, int index) override {
    DeviceGuard guard(index);
    cudaStream_t s = stream(index);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
    // Pageable source memory may be reused by the caller as soon as we return.
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  void copy_on_device(void* dst, const void* src, std::size_t n, int index) override {
    DeviceGuard guard(index);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream(index)));
  }
  void memset_zero(void* dst, std::size_t n, int index) override {
    DeviceGuard guard(index);
    KILN_CUDA_CHECK(cudaMemsetAsync(dst, 0, n, stream(index)));
  }

  Stream current_stream(int index) const override { return {Device::cuda(index), stream(index)}; }
  void set_current_stream(Stream s) override { current_streams()[s.device.index] = static_cast<cudaStream_t>(s.handle); }
  void synchronize(int index) override {
    DeviceGuard guard(index);
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream(index)));
  }

  CachingAllocator& allocator(int index) const { return *devices_.at(index).allocator; }

  cudaStream_t stream(int index) const {
    auto& cur = current_streams();
    if (cur.size() <= static_cast<std::size_t>(index)) cur.resize(devices_.size(), nullptr);
    if (cur[index]) return cur[index];
    auto& dev = devices_.at(index);
    std::call_once(dev.stream_once, [&] {
      DeviceGuard guard(index);
      KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&dev.compute_stream, cudaStreamNonBlocking));
    });
    return dev.compute_stream;
  }

 private:
  // The current stream is per thread, as in CUDA and PyTorch; nullptr means the compute stream.
  static std::vector<cudaStream_t>& current_streams() {
    thread_local std::vector<cudaStream_t> streams;
    return streams;
  }

  struct PerDevice {
    std::unique_ptr<CachingAllocator> allocator;
    mutable std::once_flag stream_once;
    mutable cudaStream_t compute_stream = nullptr;
  };
  mutable std::deque<PerDevice> devices_;  // deque: PerDevice holds a once_flag and cannot move
};

}  // namespace

cudaStream_t cuda_stream(int index) {
  // Taken on every launch: resolve the backend once (registered for the process lifetime) and
  // skip the registry's call_once and the virtual current_stream().
  static CudaBackend* const backend = &static_cast<CudaBackend&>(backends().get(DeviceKind::CUDA));
  return backend->stream(index);
}

CachingAllocator& cuda_caching_allocator(int index) {
  return static_cast<CudaBackend&>(backends().get(DeviceKind::CUDA)).allocator(index);
}

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace kiln
