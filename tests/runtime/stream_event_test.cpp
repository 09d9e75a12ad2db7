// Streams and events on the CPU backend, where work completes before its call returns: one stream
// (always idle), events are host clock readings. The CUDA behaviour is tested in
// tests/cuda/streams_events_test.cpp.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/event.h"
#include "kiln/runtime/stream.h"

namespace kiln {
namespace stream_event_test {

TEST(CpuStream, OneIdleStream) {
  const Stream compute = Stream::compute(Device::cpu());
  EXPECT_EQ(compute.device, Device::cpu());
  EXPECT_EQ(Stream::current(Device::cpu()), compute);
  EXPECT_EQ(Stream::from_pool(Device::cpu(), StreamPriority::High), compute);
  EXPECT_TRUE(compute.query());
  compute.synchronize();
  {
    StreamGuard guard(Stream::from_pool(Device::cpu()));
    EXPECT_EQ(Stream::current(Device::cpu()), compute);
  }
  EXPECT_EQ(compute.str(), "cpu stream");
}

TEST(CpuEvent, TimesHostWork) {
  Event start(Device::cpu()), stop(Device::cpu());
  EXPECT_TRUE(start.query());  // never recorded: has happened
  start.record();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop.record(Stream::current(Device::cpu()));
  stop.wait(Stream::compute(Device::cpu()));
  stop.synchronize();
  EXPECT_TRUE(stop.query());
  EXPECT_GE(stop.elapsed_ms(start), 19.0);
  Event moved = std::move(stop);
  EXPECT_GE(moved.elapsed_ms(start), 19.0);
}

TEST(CpuEvent, RefusesStreamsOfAnotherDevice) {
  Event e(Device::cpu());
  const Stream elsewhere{Device::cuda(0), nullptr};
  try {
    e.record(elsewhere);
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("the event is on cpu but the stream is on cuda:0"), std::string::npos)
        << err.what();
  }
  EXPECT_THROW(e.wait(elsewhere), Error);
}

TEST(CpuEvent, ElapsedNeedsTimingEvents) {
  Event a(Device::cpu(), /*timing=*/false), b(Device::cpu());
  a.record();
  b.record();
  EXPECT_THROW((void)b.elapsed_ms(a), Error);
}

TEST(CpuBackend, RecordStreamIsANoOpOnTheHost) {
  Backend& cpu = backend_for(Device::cpu());
  void* p = cpu.allocate(256, 0);
  cpu.record_stream(p, Stream::compute(Device::cpu()));
  cpu.deallocate(p, 0);
}

}  // namespace stream_event_test
}  // namespace kiln
