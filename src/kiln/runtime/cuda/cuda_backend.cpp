// The CUDA backend: one caching allocator, one non-blocking compute stream and a pool of side
// streams per device. Kiln's kernels run on the device's current stream (never the legacy default
// stream, so whole training steps can be captured into CUDA graphs).
#include <array>
#include <atomic>
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

// The allocator's stream events (record_stream): ordering only, so without timing.
CachingAllocator::StreamEvents allocator_events(int index) {
  CachingAllocator::StreamEvents e;
  e.record = [index](void* stream) -> void* {
    DeviceGuard guard(index);
    cudaEvent_t event = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventRecord(event, static_cast<cudaStream_t>(stream)));
    return event;
  };
  e.query = [](void* event) {
    const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    KILN_CUDA_CHECK(status);
    return true;
  };
  e.synchronize = [](void* event) { KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event))); };
  e.destroy = [](void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); };
  return e;
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
    detail::g_cuda_single_device.store(count == 1, std::memory_order_relaxed);
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
            detail::g_cuda_memory_allocated.store(true, std::memory_order_relaxed);
            return p;
          },
          [i](void* p) {
            DeviceGuard guard(i);
            cudaFree(p);
          },
          [i] { return free_device_bytes(i); }, allocator_events(i));
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

  // A block belongs to the stream that allocates it (the current one): see caching_allocator.h.
  void* allocate(std::size_t bytes, int index) override {
    return devices_.at(index).allocator->allocate(bytes, stream(index));
  }
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
  void set_current_stream(Stream s) override {
    const int index = s.device.index;
    KILN_CHECK(index >= 0 && index < device_count() && index < kMaxDevices,
               "set_current_stream: device {} does not exist ({} CUDA device(s))", s.device.str(), device_count());
    current_streams_[index] = static_cast<cudaStream_t>(s.handle);
  }
  void synchronize(int index) override {
    DeviceGuard guard(index);
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream(index)));
  }
  Stream compute_stream(int index) const override { return {Device::cuda(index), compute(index)}; }
  Stream pool_stream(int index, StreamPriority priority) override {
    KILN_CHECK(index >= 0 && index < device_count(),
               "Stream::from_pool: device cuda:{} does not exist ({} CUDA device(s))", index, device_count());
    PerDevice& dev = devices_.at(index);
    const int p = priority == StreamPriority::High ? 1 : 0;
    const std::size_t slot = dev.next_pool_stream[p].fetch_add(1, std::memory_order_relaxed) % kPoolStreams;
    std::lock_guard lock(dev.pool_mutex);
    cudaStream_t& s = dev.pool[p][slot];
    if (s == nullptr) {
      DeviceGuard guard(index);
      int least = 0, greatest = 0;
      KILN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      KILN_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, p == 1 ? greatest : least));
    }
    return {Device::cuda(index), s};
  }
  void synchronize_stream(Stream s) override {
    DeviceGuard guard(s.device.index);
    KILN_CUDA_CHECK(cudaStreamSynchronize(native(s)));
  }
  bool query_stream(Stream s) override {
    DeviceGuard guard(s.device.index);
    const cudaError_t status = cudaStreamQuery(native(s));
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    KILN_CUDA_CHECK(status);
    return true;
  }
  void record_stream(void* ptr, Stream s) override {
    CachingAllocator& allocator = *devices_.at(s.device.index).allocator;
    // Memory Kiln does not own (a tensor made from a blob) is the caller's to keep alive.
    if (ptr == nullptr || !allocator.is_live(ptr)) return;
    allocator.record_stream(ptr, native(s));
  }

  CachingAllocator& allocator(int index) const { return *devices_.at(index).allocator; }

  // Taken on every kernel launch, so the common case is two plain loads: the thread's current
  // stream, then the device's compute stream once created (std::call_once only the first time).
  cudaStream_t stream(int index) const {
    if (index >= 0 && index < kMaxDevices && current_streams_[index]) return current_streams_[index];
    return compute(index);
  }

 private:
  // The handle of a Stream; nullptr names the compute stream.
  cudaStream_t native(Stream s) const {
    return s.handle != nullptr ? static_cast<cudaStream_t>(s.handle) : compute(s.device.index);
  }

  cudaStream_t compute(int index) const {
    auto& dev = devices_.at(index);
    if (cudaStream_t s = dev.compute_stream.load(std::memory_order_acquire)) return s;
    std::call_once(dev.stream_once, [&] {
      DeviceGuard guard(index);
      cudaStream_t s = nullptr;
      KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      dev.compute_stream.store(s, std::memory_order_release);
    });
    return dev.compute_stream.load(std::memory_order_acquire);
  }

  static constexpr int kMaxDevices = 64;
  static constexpr std::size_t kPoolStreams = 4;  // per device and priority
  // The current stream is per thread, as in CUDA and PyTorch; nullptr means the compute stream.
  // A constant-initialised array: no thread_local construction guard on the launch path.
  static thread_local cudaStream_t current_streams_[kMaxDevices];

  struct PerDevice {
    std::unique_ptr<CachingAllocator> allocator;
    mutable std::once_flag stream_once;
    mutable std::atomic<cudaStream_t> compute_stream{nullptr};
    // Side streams, [normal, high] priority, made on first use and kept for the process lifetime.
    std::mutex pool_mutex;
    std::array<std::array<cudaStream_t, kPoolStreams>, 2> pool{};
    std::array<std::atomic<std::size_t>, 2> next_pool_stream{};
  };
  mutable std::deque<PerDevice> devices_;  // deque: PerDevice holds a once_flag and cannot move
};

thread_local cudaStream_t CudaBackend::current_streams_[CudaBackend::kMaxDevices] = {};

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
