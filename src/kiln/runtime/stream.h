#pragma once
// Stream: an ordered queue of work on one device. Kernels, copies and collectives enqueued on one
// stream run in order; work on different streams may overlap and is ordered only through events
// (runtime/event.h). Each device has a compute stream, where Kiln's kernels run unless a
// StreamGuard names another, and a pool of side streams (normal and high priority), as PyTorch's
// CUDA stream pool: the backend owns every stream for the life of the process, so a Stream is a
// plain value that may be copied and stored freely.
//
// On the CPU every operation completes before it returns: there is one stream (handle nullptr),
// and recording, waiting and synchronising are trivially done.
#include <cstdint>
#include <string>

#include "kiln/runtime/device.h"

namespace kiln {

// High-priority streams get free SMs first: small latency-critical kernels (HPL's panel, a
// pipeline's send/recv) are scheduled ahead of a big GEMM's blocks on the normal streams.
enum class StreamPriority : std::uint8_t { Normal, High };

struct Stream {
  Device device;
  // The backend's stream (a cudaStream_t on CUDA). Backend::set_current_stream takes nullptr as
  // "the compute stream"; every Stream the functions below return has the real handle.
  void* handle = nullptr;

  // The stream Kiln's kernels on `device` use when no StreamGuard is active.
  static Stream compute(Device device);
  // The stream this thread's kernels on `device` launch on now (the innermost StreamGuard's).
  static Stream current(Device device);
  // A stream from the device's pool (round robin over a few per priority, created on first use).
  // Two calls may return the same stream once the pool wraps around, which orders their work but
  // never breaks it.
  static Stream from_pool(Device device, StreamPriority priority = StreamPriority::Normal);

  void synchronize() const;  // the host waits until all work enqueued so far is done
  bool query() const;        // true when all work enqueued so far is done
  std::string str() const;   // "cuda:0 stream 0x..." for messages
  friend bool operator==(const Stream&, const Stream&) = default;
};

// While alive, kernels this thread launches on the stream's device go to `stream`; the previous
// current stream comes back on destruction (guards nest). Thread-local, as CUDA's and PyTorch's.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

}  // namespace kiln
