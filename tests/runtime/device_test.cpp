#include "kiln/runtime/device.h"

#include <gtest/gtest.h>

#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"

namespace kiln {
namespace device_test {

TEST(Device, ParsesNames) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
}

TEST(Device, RejectsUnknownNamesWithTheText) {
  try {
    Device::parse("tpu:0");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tpu:0"), std::string::npos);
  }
  EXPECT_THROW(Device::parse("cuda:x"), Error);
}

TEST(Backend, CpuIsAlwaysRegistered) {
  EXPECT_EQ(device_count(DeviceKind::CPU), 1);
  auto& cpu = backend_for(Device::cpu());
  void* p = cpu.allocate(100, 0);
  ASSERT_NE(p, nullptr);
  EXPECT_GE(cpu.memory_stats(0).allocated, 100u);
  cpu.deallocate(p, 0);
}

TEST(Backend, MissingDeviceIsAClearError) {
  try {
    backend_for(Device::cpu());
    backend_for(Device{DeviceKind::CPU, 5});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos);
  }
}

}  // namespace device_test
}  // namespace kiln
