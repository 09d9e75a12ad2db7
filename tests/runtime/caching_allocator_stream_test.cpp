// The caching allocator's stream order, through its bookkeeping alone (fake streams and events,
// host memory): a block is reused only on the stream it was allocated on, and a block that
// record_stream marked as used on another stream is reused only after that stream's event (recorded
// when it was freed) has happened. The CUDA backend runs the same code with real events
// (tests/cuda/streams_events_test.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "kiln/runtime/caching_allocator.h"
#include "kiln/runtime/error.h"

namespace kiln {
namespace caching_allocator_stream_test {

// Streams are plain addresses; an event is an index into `done`, which the test flips.
struct FakeDevice {
  int allocations = 0, frees = 0;
  int recorded = 0, synchronized = 0, destroyed = 0;
  std::map<std::size_t, bool> done;  // event id -> has happened
  std::map<std::size_t, void*> stream_of;
  bool out_of_memory = false;  // the next raw allocation fails while true
};

void* stream(int i) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(0x1000 * i)); }

CachingAllocator make_allocator(FakeDevice& d) {
  CachingAllocator::StreamEvents events;
  events.record = [&d](void* s) -> void* {
    const std::size_t id = static_cast<std::size_t>(++d.recorded);
    d.done[id] = false;
    d.stream_of[id] = s;
    return reinterpret_cast<void*>(id);
  };
  events.query = [&d](void* e) { return d.done.at(reinterpret_cast<std::size_t>(e)); };
  events.synchronize = [&d](void* e) {
    ++d.synchronized;
    d.done.at(reinterpret_cast<std::size_t>(e)) = true;  // the host waited: it has happened
  };
  events.destroy = [&d](void*) { ++d.destroyed; };
  return CachingAllocator(
      "fake",
      [&d](std::size_t n) -> void* {
        if (d.out_of_memory) {
          d.out_of_memory = false;
          return nullptr;
        }
        ++d.allocations;
        return std::malloc(n);
      },
      [&d](void* p) {
        ++d.frees;
        std::free(p);
      },
      [] { return std::size_t{1} << 30; }, std::move(events));
}

void complete_all(FakeDevice& d) {
  for (auto& [id, done] : d.done) done = true;
}

TEST(CachingAllocatorStreams, BlocksAreReusedOnlyOnTheirOwnStream) {
  FakeDevice d;
  auto alloc = make_allocator(d);
  void* a = alloc.allocate(1000, stream(1));
  alloc.deallocate(a);
  void* b = alloc.allocate(1000, stream(2));  // another stream: not a's block
  EXPECT_NE(b, a);
  EXPECT_EQ(d.allocations, 2);
  void* c = alloc.allocate(1000, stream(1));  // a's stream: its block again
  EXPECT_EQ(c, a);
  EXPECT_EQ(d.allocations, 2);
  alloc.deallocate(b);
  alloc.deallocate(c);
  EXPECT_EQ(d.recorded, 0);  // no other stream used them: no events
}

TEST(CachingAllocatorStreams, RecordStreamDefersReuseUntilTheEventHappens) {
  FakeDevice d;
  auto alloc = make_allocator(d);
  void* a = alloc.allocate(1000, stream(1));
  alloc.record_stream(a, stream(2));
  alloc.record_stream(a, stream(2));  // twice: one use
  alloc.record_stream(a, stream(1));  // its own stream: nothing to record
  alloc.deallocate(a);
  EXPECT_EQ(d.recorded, 1);
  EXPECT_EQ(d.stream_of.at(1), stream(2));  // the event is on the stream that used it
  EXPECT_EQ(alloc.pending_blocks(), 1u);
  EXPECT_EQ(alloc.stats().allocated, 0u);  // not a tensor's any more, still reserved
  EXPECT_EQ(alloc.stats().reserved, CachingAllocator::segment_size(1000));

  void* b = alloc.allocate(1000, stream(1));  // stream 2 may still read a: another block
  EXPECT_NE(b, a);
  EXPECT_EQ(d.allocations, 1);  // split off the segment's free rest
  alloc.deallocate(b);

  complete_all(d);                            // stream 2 passed the event
  void* c = alloc.allocate(1000, stream(1));  // a is free again (b is too; either fits)
  EXPECT_TRUE(c == a || c == b);
  EXPECT_EQ(alloc.pending_blocks(), 0u);
  EXPECT_EQ(d.destroyed, 1);
  void* e = alloc.allocate(1000, stream(1));  // and the other one
  EXPECT_TRUE((e == a || e == b) && e != c);
  EXPECT_EQ(d.allocations, 1);
  alloc.deallocate(c);
  alloc.deallocate(e);
}

TEST(CachingAllocatorStreams, OneEventPerStreamThatUsedTheBlock) {
  FakeDevice d;
  auto alloc = make_allocator(d);
  void* a = alloc.allocate(4096, stream(1));
  alloc.record_stream(a, stream(2));
  alloc.record_stream(a, stream(3));
  alloc.deallocate(a);
  EXPECT_EQ(d.recorded, 2);
  d.done.at(1) = true;  // stream 2 is done, stream 3 is not
  EXPECT_NE(alloc.allocate(4096, stream(1)), a);
  d.done.at(2) = true;
  EXPECT_EQ(alloc.allocate(4096, stream(1)), a);
}

TEST(CachingAllocatorStreams, OutOfMemoryWaitsForPendingBlocksBeforeGivingUp) {
  FakeDevice d;
  auto alloc = make_allocator(d);
  void* a = alloc.allocate(12 << 20, stream(1));  // a segment of its own
  alloc.record_stream(a, stream(2));
  alloc.deallocate(a);
  // The driver refuses once: the allocator waits for stream 2, frees the cache, and retries.
  d.out_of_memory = true;
  void* b = alloc.allocate(16 << 20, stream(1));
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(d.synchronized, 1);
  EXPECT_EQ(d.frees, 1);  // a went back to the driver
  EXPECT_EQ(alloc.pending_blocks(), 0u);
  alloc.deallocate(b);
}

TEST(CachingAllocatorStreams, EmptyCacheWaitsForPendingBlocks) {
  FakeDevice d;
  auto alloc = make_allocator(d);
  void* a = alloc.allocate(1000, stream(1));
  alloc.record_stream(a, stream(2));
  alloc.deallocate(a);
  alloc.empty_cache();
  EXPECT_EQ(d.synchronized, 1);
  EXPECT_EQ(d.frees, 1);
  EXPECT_EQ(alloc.stats().reserved, 0u);
}

TEST(CachingAllocatorStreams, BlocksFreedDuringACaptureGetTheirEventsWhenItEnds) {
  FakeDevice d;
  auto alloc = make_allocator(d);
  auto pool = alloc.create_pool();
  alloc.begin_pool(pool);
  void* a = alloc.allocate(1000, stream(1));
  alloc.record_stream(a, stream(2));
  alloc.deallocate(a);
  EXPECT_EQ(d.recorded, 0);  // an event recorded inside a capture could not be queried
  EXPECT_EQ(alloc.pending_blocks(), 1u);
  void* b = alloc.allocate(1000, stream(1));  // not reused inside the capture either
  EXPECT_NE(b, a);
  alloc.end_pool();
  EXPECT_EQ(d.recorded, 1);
  complete_all(d);
  alloc.deallocate(b);
  // Once its event happened, a is the pool's again: the next capture in the pool reuses it.
  alloc.begin_pool(pool);
  void* c = alloc.allocate(1000, stream(1));
  void* e = alloc.allocate(1000, stream(1));
  EXPECT_TRUE((c == a || c == b) && (e == a || e == b) && c != e) << "pool blocks reused";
  EXPECT_EQ(d.allocations, 1);  // one segment of the pool
  alloc.end_pool();
  alloc.deallocate(c);
  alloc.deallocate(e);
  alloc.release_pool(pool);
}

TEST(CachingAllocatorStreams, RecordStreamRefusesUnknownPointers) {
  FakeDevice d;
  auto alloc = make_allocator(d);
  int local = 0;
  try {
    alloc.record_stream(&local, stream(2));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a live block"), std::string::npos) << e.what();
  }
  void* a = alloc.allocate(100, stream(1));
  alloc.deallocate(a);
  EXPECT_THROW(alloc.record_stream(a, stream(2)), Error);  // freed already
}

TEST(CachingAllocatorStreams, WithoutStreamEventsOtherStreamsAreRefused) {
  CachingAllocator alloc(
      "plain", [](std::size_t n) { return std::malloc(n); }, [](void* p) { std::free(p); },
      [] { return std::size_t{0}; });
  void* a = alloc.allocate(100);
  alloc.record_stream(a, nullptr);  // its own stream: fine
  try {
    alloc.record_stream(a, stream(2));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no stream events"), std::string::npos) << e.what();
  }
  alloc.deallocate(a);
}

}  // namespace caching_allocator_stream_test
}  // namespace kiln
