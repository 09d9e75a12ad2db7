#include "kiln/runtime/stream.h"

#include <fmt/format.h>

#include "kiln/runtime/backend.h"

namespace kiln {

Stream Stream::compute(Device device) { return backend_for(device).compute_stream(device.index); }

Stream Stream::current(Device device) { return backend_for(device).current_stream(device.index); }

Stream Stream::from_pool(Device device, StreamPriority priority) {
  return backend_for(device).pool_stream(device.index, priority);
}

void Stream::synchronize() const { backend_for(device).synchronize_stream(*this); }

bool Stream::query() const { return backend_for(device).query_stream(*this); }

std::string Stream::str() const {
  if (device.is_cpu()) return "cpu stream";
  return fmt::format("{} stream {}", device.str(), handle);
}

StreamGuard::StreamGuard(Stream stream) : previous_(Stream::current(stream.device)) {
  backend_for(stream.device).set_current_stream(stream);
}

StreamGuard::~StreamGuard() { backend_for(previous_.device).set_current_stream(previous_); }

}  // namespace kiln
