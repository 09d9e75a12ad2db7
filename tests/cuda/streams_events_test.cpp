// Streams, events and record_stream on a GPU. A host function that sleeps holds a side stream
// back, so the tests can see whether other work waited for it (or did not).
#include <gtest/gtest.h>

#include "kiln/runtime/backend.h"
#include "kiln/runtime/event.h"
#include "kiln/runtime/stream.h"

#if KILN_WITH_CUDA
#include <cuda_runtime.h>

#include <chrono>
#include <thread>
#include <vector>

namespace kiln {
namespace streams_events_test {

#define REQUIRE_GPU()                                                                       \
  do {                                                                                      \
    if (::kiln::device_count(::kiln::DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA GPU"; \
  } while (0)

cudaStream_t native(const Stream& s) { return static_cast<cudaStream_t>(s.handle); }

// Holds `stream` back for `ms` milliseconds (the host function runs in stream order).
void stall(const Stream& stream, int ms) {
  static int delay = 0;
  delay = ms;
  ASSERT_EQ(cudaLaunchHostFunc(
                native(stream), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(delay)); }, nullptr),
            cudaSuccess);
}

TEST(CudaStreams, PoolStreamsAreDistinctAndHighPriorityRanksFirst) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const Stream compute = Stream::compute(gpu);
  const Stream high1 = Stream::from_pool(gpu, StreamPriority::High);
  const Stream high2 = Stream::from_pool(gpu, StreamPriority::High);
  const Stream normal = Stream::from_pool(gpu);
  EXPECT_NE(high1, high2);
  EXPECT_NE(high1, compute);
  EXPECT_NE(normal, compute);
  int p_high = 0, p_normal = 0;
  ASSERT_EQ(cudaStreamGetPriority(native(high1), &p_high), cudaSuccess);
  ASSERT_EQ(cudaStreamGetPriority(native(normal), &p_normal), cudaSuccess);
  EXPECT_LT(p_high, p_normal);  // CUDA: lower numbers are higher priorities
}

TEST(CudaStreams, GuardSetsTheCurrentStreamAndRestoresIt) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const Stream before = Stream::current(gpu);
  const Stream a = Stream::from_pool(gpu), b = Stream::from_pool(gpu, StreamPriority::High);
  {
    StreamGuard ga(a);
    EXPECT_EQ(Stream::current(gpu), a);
    {
      StreamGuard gb(b);
      EXPECT_EQ(Stream::current(gpu), b);
    }
    EXPECT_EQ(Stream::current(gpu), a);
  }
  EXPECT_EQ(Stream::current(gpu), before);
}

TEST(CudaEvents, WaitOrdersAnotherStreamsWork) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Backend& cuda = backend_for(gpu);
  const std::size_t n = 1 << 20;
  void* src = cuda.allocate(n, 0);
  void* dst = cuda.allocate(n, 0);
  cuda.memset_zero(src, n, 0);
  cuda.memset_zero(dst, n, 0);
  Stream::compute(gpu).synchronize();

  const Stream side = Stream::from_pool(gpu);
  stall(side, 100);
  ASSERT_EQ(cudaMemsetAsync(src, 7, n, native(side)), cudaSuccess);  // after the stall
  Event written(gpu, /*timing=*/false);
  written.record(side);
  EXPECT_FALSE(written.query());  // the side stream is still stalled
  written.wait(Stream::compute(gpu));
  cuda.copy_on_device(dst, src, n, 0);  // on the compute stream: after the memset
  std::vector<unsigned char> host(n);
  cuda.copy_to_host(host.data(), dst, n, 0);
  EXPECT_EQ(host.front(), 7);
  EXPECT_EQ(host.back(), 7);
  EXPECT_TRUE(written.query());
  cuda.deallocate(src, 0);
  cuda.deallocate(dst, 0);
}

TEST(CudaEvents, ElapsedTimeCoversTheWorkBetween) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const Stream side = Stream::from_pool(gpu);
  Event start(gpu), stop(gpu);
  start.record(side);
  stall(side, 50);
  stop.record(side);
  stop.synchronize();
  EXPECT_TRUE(stop.query());
  EXPECT_GE(stop.elapsed_ms(start), 45.0);
}

TEST(CudaAllocator, RecordStreamKeepsABlockFromReuseUntilTheSideStreamIsDone) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Backend& cuda = backend_for(gpu);
  Stream::compute(gpu).synchronize();
  const std::size_t bytes = 3 << 20;
  void* block = cuda.allocate(bytes, 0);  // the best fit among what other tests left cached
  const Stream side = Stream::from_pool(gpu);
  stall(side, 200);
  ASSERT_EQ(cudaMemsetAsync(block, 1, bytes, native(side)), cudaSuccess);  // the side stream uses it
  cuda.record_stream(block, side);
  cuda.deallocate(block, 0);
  void* again = cuda.allocate(bytes, 0);  // the side stream is still stalled: not the same block
  EXPECT_NE(again, block);
  side.synchronize();
  // With `again` freed too, the cache is as it was before `block` (freed blocks merge back), so
  // the best fit is `block` again, once its event has been seen to happen.
  cuda.deallocate(again, 0);
  void* reused = cuda.allocate(bytes, 0);  // now it is free
  EXPECT_EQ(reused, block);
  cuda.deallocate(reused, 0);
}

TEST(CudaAllocator, WithoutRecordStreamTheBlockIsReusedAtOnce) {
  // The contrast to the test above: stream order alone lets the compute stream reuse a block it
  // freed at once (its later work runs after the free anyway).
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Backend& cuda = backend_for(gpu);
  const std::size_t bytes = 5 << 20;
  void* block = cuda.allocate(bytes, 0);
  cuda.deallocate(block, 0);
  void* again = cuda.allocate(bytes, 0);
  EXPECT_EQ(again, block);
  cuda.deallocate(again, 0);
}

}  // namespace streams_events_test
}  // namespace kiln

#else
TEST(CudaStreams, NotBuilt) { GTEST_SKIP() << "this build of Kiln has no CUDA"; }
#endif
