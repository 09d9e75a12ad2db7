#pragma once
// Event: a point in a device's stream, for timing (elapsed_ms) and ordering. On the CPU it is a
// host clock reading, so benchmarks time both backends the same way.
#include <chrono>

#include "kiln/runtime/device.h"

namespace kiln {

class Event {
 public:
  explicit Event(Device device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record();        // on the device's current stream
  void synchronize();   // wait on the host until the event has happened
  // Milliseconds from `start` to this event; both must have been recorded on the same device.
  double elapsed_ms(const Event& start);

 private:
  Device device_;
  void* handle_ = nullptr;
  std::chrono::steady_clock::time_point host_time_{};
};

}  // namespace kiln
