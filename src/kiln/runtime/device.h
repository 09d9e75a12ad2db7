#pragma once
// Device: where a tensor lives. `cpu`, `cuda:N`; `musa` is reserved for the Moore Threads backend.
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

enum class DeviceKind : std::uint8_t { CPU = 0, CUDA = 1, MUSA = 2 };
inline constexpr int kNumDeviceKinds = 3;

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;

  static constexpr Device cpu() { return {DeviceKind::CPU, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceKind::CUDA, i}; }
  // Parses "cpu", "cuda", "cuda:1"; throws kiln::Error naming the text otherwise.
  static Device parse(std::string_view text);

  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  std::string str() const;
  friend constexpr bool operator==(Device, Device) = default;
};

const char* device_kind_name(DeviceKind kind);

}  // namespace kiln
