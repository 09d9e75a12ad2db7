// Block splitting and merging in the caching allocator: a request is carved from a free block of a
// segment, the rest stays free, and a freed block merges with its free neighbours; a segment goes
// back to the driver only when it is wholly free. Host memory and fake streams stand in for the
// device, as in the other caching allocator tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "kiln/runtime/caching_allocator.h"
#include "kiln/runtime/error.h"

namespace kiln {
namespace caching_allocator_split_test {

constexpr std::size_t kMiB = 1 << 20;

// The driver: segments it handed out, by address, within a byte limit.
struct FakeDriver {
  std::map<void*, std::size_t> segments;
  std::size_t limit = SIZE_MAX, used = 0;
  int allocations = 0, frees = 0;
  std::map<std::size_t, bool> done;  // event id -> has happened
  int events = 0;
};

void* stream(int i) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(0x1000 * i)); }

CachingAllocator make_allocator(FakeDriver& d) {
  CachingAllocator::StreamEvents events;
  events.record = [&d](void*) -> void* {
    const auto id = static_cast<std::size_t>(++d.events);
    d.done[id] = false;
    return reinterpret_cast<void*>(id);
  };
  events.query = [&d](void* e) { return d.done.at(reinterpret_cast<std::size_t>(e)); };
  events.synchronize = [&d](void* e) { d.done.at(reinterpret_cast<std::size_t>(e)) = true; };
  events.destroy = [](void*) {};
  return CachingAllocator(
      "split",
      [&d](std::size_t n) -> void* {
        if (d.used + n > d.limit) return nullptr;
        void* p = std::malloc(n);
        d.segments[p] = n;
        d.used += n;
        ++d.allocations;
        return p;
      },
      [&d](void* p) {
        d.used -= d.segments.at(p);
        d.segments.erase(p);
        ++d.frees;
        std::free(p);
      },
      [&d] { return d.limit - d.used; }, std::move(events));
}

char* bytes(void* p) { return static_cast<char*>(p); }

TEST(CachingAllocatorSplit, RequestsAreCarvedFromOneSegmentAndCountedExactly) {
  FakeDriver d;
  auto alloc = make_allocator(d);
  void* a = alloc.allocate(1000);  // 1024
  void* b = alloc.allocate(3000);  // 3072
  void* c = alloc.allocate(100);   // 512
  EXPECT_EQ(d.allocations, 1);
  EXPECT_EQ(bytes(b), bytes(a) + 1024);
  EXPECT_EQ(bytes(c), bytes(b) + 3072);
  auto s = alloc.stats();
  EXPECT_EQ(s.allocated, 1024u + 3072u + 512u);
  EXPECT_EQ(s.requested, s.allocated);
  EXPECT_EQ(s.reserved, 2 * kMiB);
  alloc.deallocate(b);
  void* e = alloc.allocate(2000);  // 2048 out of b's hole: not the whole 3072
  EXPECT_EQ(e, b);
  EXPECT_EQ(alloc.stats().allocated, 1024u + 2048u + 512u);
  EXPECT_EQ(alloc.stats().peak_allocated, 1024u + 3072u + 512u);
  alloc.deallocate(a);
  alloc.deallocate(c);
  alloc.deallocate(e);
  EXPECT_EQ(alloc.stats().allocated, 0u);
  void* whole = alloc.allocate(2 * kMiB - 2048);  // a large request: the large pool, not the merged segment
  EXPECT_EQ(d.allocations, 2);
  EXPECT_EQ(alloc.stats().reserved, 2 * kMiB + 20 * kMiB);
  alloc.deallocate(whole);
  alloc.empty_cache();
  EXPECT_EQ(d.frees, 2);
  EXPECT_TRUE(d.segments.empty());
}

TEST(CachingAllocatorSplit, AFreedMiddleBlockMergesWithBothNeighbours) {
  FakeDriver d;
  auto alloc = make_allocator(d);
  void* a = alloc.allocate(512);
  void* b = alloc.allocate(512);
  void* c = alloc.allocate(512);
  void* pin = alloc.allocate(512);  // keeps the merged hole apart from the segment's rest
  alloc.deallocate(a);
  alloc.deallocate(c);
  alloc.deallocate(b);  // a, b and c are one 1536-byte hole now
  void* x = alloc.allocate(1536);
  EXPECT_EQ(x, a);
  EXPECT_EQ(d.allocations, 1);
  // And the other way round: a freed after its right neighbour, then the right one's left.
  alloc.deallocate(x);
  void* p = alloc.allocate(512);
  void* q = alloc.allocate(1024);
  EXPECT_EQ(p, a);
  EXPECT_EQ(bytes(q), bytes(a) + 512);
  alloc.deallocate(q);
  alloc.deallocate(p);
  EXPECT_EQ(alloc.allocate(1536), a);
  alloc.deallocate(a);
  alloc.deallocate(pin);  // the whole segment is one free block again
  void* all = alloc.allocate(kMiB);
  EXPECT_EQ(all, a);
  EXPECT_EQ(d.allocations, 1);
  alloc.deallocate(all);
}

TEST(CachingAllocatorSplit, EmptyCacheReleasesOnlyWhollyFreeSegments) {
  FakeDriver d;
  auto alloc = make_allocator(d);
  void* small_live = alloc.allocate(1000);
  void* small_gone = alloc.allocate(1000, stream(1));  // another stream: a segment of its own
  void* large_live = alloc.allocate(2 * kMiB);
  void* large_gone = alloc.allocate(20 * kMiB);  // more than the 18 MiB left: a segment of its own
  void* large_neighbour = alloc.allocate(2 * kMiB);
  EXPECT_EQ(d.allocations, 4);
  alloc.deallocate(small_gone);
  alloc.deallocate(large_gone);
  alloc.deallocate(large_neighbour);  // its segment still holds large_live
  alloc.empty_cache();
  EXPECT_EQ(d.frees, 2);
  EXPECT_EQ(d.segments.size(), 2u);
  EXPECT_EQ(alloc.stats().reserved, 2 * kMiB + 20 * kMiB);
  EXPECT_EQ(alloc.stats().allocated, 1024u + 2 * kMiB);
  alloc.deallocate(small_live);
  alloc.deallocate(large_live);
  alloc.empty_cache();
  EXPECT_TRUE(d.segments.empty());
  EXPECT_EQ(alloc.stats().reserved, 0u);
}

TEST(CachingAllocatorSplit, OutOfMemoryReleasesFreeSegmentsAndRetries) {
  FakeDriver d;
  d.limit = 28 * kMiB;
  auto alloc = make_allocator(d);
  void* a = alloc.allocate(2 * kMiB);  // a 20 MiB segment
  void* s = alloc.allocate(1000);      // a 2 MiB one
  alloc.deallocate(a);
  void* big = alloc.allocate(22 * kMiB);  // no room beside the free 20 MiB: it is released first
  EXPECT_EQ(d.frees, 1);
  EXPECT_EQ(alloc.stats().reserved, 2 * kMiB + 22 * kMiB);
  // A 20 MiB segment does not fit any more, the request alone does: it gets a segment of its size.
  void* c = alloc.allocate(3 * kMiB);
  EXPECT_EQ(d.segments.at(c), 3 * kMiB);
  EXPECT_THROW(alloc.allocate(4 * kMiB), OutOfMemoryError);  // the segments in use stay
  EXPECT_EQ(alloc.stats().allocated, 1024u + 25 * kMiB);
  EXPECT_EQ(alloc.stats().reserved, 27 * kMiB);
  alloc.deallocate(big);
  alloc.deallocate(c);
  alloc.deallocate(s);
  alloc.empty_cache();
  EXPECT_TRUE(d.segments.empty());
}

TEST(CachingAllocatorSplit, PoolSegmentsAreSplitWithinThePool) {
  FakeDriver d;
  auto alloc = make_allocator(d);
  auto pool = alloc.create_pool();
  alloc.begin_pool(pool);
  void* a = alloc.allocate(1000);
  void* b = alloc.allocate(1000);
  EXPECT_EQ(bytes(b), bytes(a) + 1024);
  alloc.deallocate(a);
  alloc.end_pool();
  // The segment's free parts are the pool's: an allocation outside the pool gets a new segment.
  void* outside = alloc.allocate(1000);
  EXPECT_EQ(d.allocations, 2);
  EXPECT_NE(outside, a);
  alloc.deallocate(outside);
  alloc.empty_cache();  // the general segment goes; the pool's stays while b lives in it
  EXPECT_EQ(d.frees, 1);
  alloc.begin_pool(pool);
  void* c = alloc.allocate(500);  // a's hole, split
  EXPECT_EQ(c, a);
  alloc.end_pool();
  alloc.deallocate(c);
  alloc.deallocate(b);
  EXPECT_EQ(alloc.pool_blocks(pool), 1u);  // merged back to one free block
  alloc.empty_cache();                     // still the pool's: not freed
  EXPECT_EQ(d.frees, 1);
  alloc.release_pool(pool);
  alloc.empty_cache();
  EXPECT_EQ(d.frees, 2);
  EXPECT_TRUE(d.segments.empty());
}

TEST(CachingAllocatorSplit, APendingBlockIsNotMergedUntilItsEventsHappen) {
  FakeDriver d;
  auto alloc = make_allocator(d);
  void* a = alloc.allocate(512, stream(1));
  void* b = alloc.allocate(512, stream(1));
  void* pin = alloc.allocate(512, stream(1));
  alloc.record_stream(b, stream(2));
  alloc.deallocate(b);  // pending
  alloc.deallocate(a);  // free, but not merged with b
  void* x = alloc.allocate(1024, stream(1));
  EXPECT_NE(x, a);  // a's 512 hole is too small; b's bytes are still in use on stream 2
  EXPECT_EQ(bytes(x), bytes(pin) + 512);
  alloc.deallocate(x);
  for (auto& [id, done] : d.done) done = true;
  void* y = alloc.allocate(1024, stream(1));  // b became free and merged with a
  EXPECT_EQ(y, a);
  EXPECT_EQ(alloc.pending_blocks(), 0u);
  alloc.deallocate(y);
  alloc.deallocate(pin);
  alloc.empty_cache();
  EXPECT_TRUE(d.segments.empty());
}

// Random allocations and frees (small and large, two streams, some used by another stream, some
// inside a private pool) against a reference: no two live blocks overlap, each lies in a segment
// of the driver, allocated is the sum of the live rounded requests, reserved the sum of the
// segments; everything goes back when nothing is live.
TEST(CachingAllocatorSplit, RandomSequencesKeepBlocksDisjointAndStatsExact) {
  FakeDriver d;
  auto alloc = make_allocator(d);
  std::mt19937 rng(24);
  struct Live {
    std::size_t size;
    void* stream;
  };
  std::map<char*, Live> live;  // by address
  std::size_t peak = 0;
  auto check = [&] {
    std::size_t sum = 0;
    char* end = nullptr;
    for (auto& [p, l] : live) {
      ASSERT_GE(p, end) << "live blocks overlap";
      end = p + l.size;
      sum += l.size;
      auto seg = d.segments.upper_bound(p);
      ASSERT_NE(seg, d.segments.begin());
      --seg;
      ASSERT_LE(end, static_cast<char*>(seg->first) + seg->second) << "a block outside its segment";
    }
    std::size_t reserved = 0;
    for (auto& [p, n] : d.segments) reserved += n;
    const auto s = alloc.stats();
    ASSERT_EQ(s.allocated, sum);
    ASSERT_EQ(s.requested, sum);
    ASSERT_EQ(s.reserved, reserved);
    peak = std::max(peak, sum);
    ASSERT_EQ(s.peak_allocated, peak);
  };
  CachingAllocator::PoolId pool = alloc.create_pool();
  for (int step = 0; step < 20000; ++step) {
    const int op = static_cast<int>(rng() % 100);
    if ((op < 50 || live.empty()) && live.size() < 64) {
      std::size_t n = rng() % 4 == 0 ? 1 + rng() % (14 * kMiB) : 1 + rng() % (64 * 1024);
      void* s = stream(1 + static_cast<int>(rng() % 2));
      char* p = static_cast<char*>(alloc.allocate(n, s));
      live[p] = {CachingAllocator::round_size(n), s};
      if (rng() % 8 == 0) alloc.record_stream(p, stream(3));
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      alloc.deallocate(it->first);
      live.erase(it);
    }
    if (step % 97 == 0)
      for (auto& [id, done] : d.done) done = done || rng() % 2 == 0;  // some streams move on
    if (step % 1009 == 0) alloc.empty_cache();                        // refused while a pool is active
    // A graph's pool now and then: captured for a while, then ended, and every few captures
    // released (its segments back to the general cache).
    if (step % 500 == 100) alloc.begin_pool(pool);
    if (step % 500 == 200) alloc.end_pool();
    if (step % 1500 == 1300) {
      alloc.release_pool(pool);
      pool = alloc.create_pool();
    }
    check();
    if (HasFatalFailure()) return;
  }
  for (auto& [p, l] : live) alloc.deallocate(p);
  live.clear();
  alloc.release_pool(pool);
  alloc.empty_cache();  // waits for the pending ones
  check();
  EXPECT_TRUE(d.segments.empty());
  EXPECT_EQ(alloc.pending_blocks(), 0u);
  EXPECT_EQ(d.frees, d.allocations);
}

// Threads allocating and freeing at once (the host threads of a data loader and the training
// loop): one mutex guards the segments, so every block is one thread's, each thread's bytes stay
// intact, and the stats come back to zero.
TEST(CachingAllocatorSplit, ConcurrentThreadsGetDisjointBlocks) {
  std::mutex driver_mutex;  // the fake driver's maps are not thread-safe themselves
  FakeDriver d;
  CachingAllocator alloc(
      "threads",
      [&](std::size_t n) -> void* {
        std::lock_guard lock(driver_mutex);
        void* p = std::malloc(n);
        d.segments[p] = n;
        ++d.allocations;
        return p;
      },
      [&](void* p) {
        std::lock_guard lock(driver_mutex);
        d.segments.erase(p);
        std::free(p);
      },
      [] { return std::size_t{0}; });
  std::vector<std::thread> threads;
  std::vector<int> corrupted(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<unsigned char*, std::size_t>> mine;
      for (int i = 0; i < 3000; ++i) {
        if (mine.size() < 16 && rng() % 2 == 0) {
          const std::size_t n = 1 + rng() % (rng() % 8 == 0 ? 3 * kMiB : 8192);
          auto* p = static_cast<unsigned char*>(alloc.allocate(n));
          std::fill(p, p + n, static_cast<unsigned char>(t + 1));
          mine.emplace_back(p, n);
        } else if (!mine.empty()) {
          const std::size_t k = rng() % mine.size();
          auto [p, n] = mine[k];
          if (p[0] != t + 1 || p[n - 1] != t + 1) ++corrupted[static_cast<std::size_t>(t)];
          alloc.deallocate(p);
          mine.erase(mine.begin() + static_cast<long>(k));
        }
      }
      for (auto [p, n] : mine) alloc.deallocate(p);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(corrupted, std::vector<int>(4, 0));
  EXPECT_EQ(alloc.stats().allocated, 0u);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved, 0u);
  EXPECT_TRUE(d.segments.empty());
}

}  // namespace caching_allocator_split_test
}  // namespace kiln
