#include "kiln/runtime/device.h"

#include <charconv>

#include "kiln/runtime/error.h"

namespace kiln {

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::CPU: return "cpu";
    case DeviceKind::CUDA: return "cuda";
    case DeviceKind::MUSA: return "musa";
  }
  return "unknown";
}

Device Device::parse(std::string_view text) {
  auto colon = text.find(':');
  std::string_view name = text.substr(0, colon);
  Device d;
  if (name == "cpu") {
    d.kind = DeviceKind::CPU;
  } else if (name == "cuda" || name == "gpu") {
    d.kind = DeviceKind::CUDA;
  } else if (name == "musa") {
    d.kind = DeviceKind::MUSA;
  } else {
    KILN_FAIL("unknown device '{}': expected cpu, cuda or cuda:N", text);
  }
  if (colon != std::string_view::npos) {
    std::string_view idx = text.substr(colon + 1);
    auto [ptr, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), d.index);
    KILN_CHECK(ec == std::errc() && ptr == idx.data() + idx.size() && d.index >= 0,
               "bad device index in '{}': expected a non-negative integer", text);
  }
  return d;
}

std::string Device::str() const {
  if (kind == DeviceKind::CPU) return "cpu";
  return std::string(device_kind_name(kind)) + ":" + std::to_string(index);
}

}  // namespace kiln
