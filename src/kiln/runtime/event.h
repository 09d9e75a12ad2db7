#pragma once
// Event: a point in a stream's work. record(stream) marks where the stream is now; wait(stream)
// makes another stream's later work wait for that point (on the device: the host does not block);
// query() and synchronize() ask or wait on the host; elapsed_ms() times the work between two
// events on one device. On the CPU, where work completes before its call returns, an event is a
// host clock reading, so benchmarks time both backends the same way.
#include <chrono>

#include "kiln/runtime/device.h"
#include "kiln/runtime/stream.h"

namespace kiln {

class Event {
 public:
  // Timing events cost a little more to record (CUDA's cudaEventDisableTiming is off for them);
  // events used only for ordering pass timing = false.
  explicit Event(Device device, bool timing = true);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record();                      // on the device's current stream
  void record(const Stream& stream);  // `stream` must be on the event's device
  // Work enqueued on `stream` after this call starts only once this event has happened (the
  // host does not wait). An event never recorded has already happened.
  void wait(const Stream& stream) const;
  bool query() const;        // true once the recorded work is done (or nothing was recorded)
  void synchronize() const;  // the host waits until the event has happened
  // Milliseconds from `start` to this event; both must be timing events recorded on one device.
  double elapsed_ms(const Event& start) const;

  Device device() const { return device_; }
  void* native_handle() const { return handle_; }  // a cudaEvent_t on CUDA, nullptr on the CPU

 private:
  void release();
  Device device_;
  bool timing_ = true;
  void* handle_ = nullptr;
  std::chrono::steady_clock::time_point host_time_{};
};

}  // namespace kiln
