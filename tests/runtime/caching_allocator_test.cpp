#include "kiln/runtime/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "kiln/runtime/error.h"

namespace kiln {
namespace caching_allocator_test {

struct CountingHeap {
  int allocations = 0;
  std::size_t limit = SIZE_MAX;
  std::size_t used = 0;
};

CachingAllocator make_allocator(CountingHeap& heap) {
  return CachingAllocator(
      "test",
      [&heap](std::size_t n) -> void* {
        if (heap.used + n > heap.limit) return nullptr;
        ++heap.allocations;
        heap.used += n;
        return std::malloc(n);
      },
      [&heap](void* p) {
        std::free(p);
        heap.used = 0;
      },
      [&heap] { return heap.limit - heap.used; });
}

TEST(CachingAllocator, ReusesFreedBlocksWithoutCallingTheDriver) {
  CountingHeap heap;
  auto alloc = make_allocator(heap);
  void* a = alloc.allocate(1000);
  alloc.deallocate(a);
  void* b = alloc.allocate(900);  // rounds to the same 1024-byte class
  EXPECT_EQ(a, b);
  EXPECT_EQ(heap.allocations, 1);
  alloc.deallocate(b);
}

// Blocks cycling between the cache and the live set reuse map nodes and block objects: best fit,
// splitting, merging, stats and the driver-call count must be what they are with fresh ones,
// including after empty_cache().
TEST(CachingAllocator, BlocksCyclingThroughTheCacheKeepBestFitAndStats) {
  CountingHeap heap;
  auto alloc = make_allocator(heap);
  char* small = static_cast<char*>(alloc.allocate(512));  // one 2 MiB segment: [small|mid|sep|big|rest]
  void* mid = alloc.allocate(1024);
  void* sep = alloc.allocate(512);  // stays live: keeps small+mid a hole of its own
  void* big = alloc.allocate(4096);
  EXPECT_EQ(mid, small + 512);
  alloc.deallocate(big);  // merges with the segment's free rest
  alloc.deallocate(small);
  alloc.deallocate(mid);  // merges with small: one 1536-byte hole
  for (int i = 0; i < 100; ++i) {
    void* a = alloc.allocate(700);  // 1024: best fit is the 1536 hole, not the rest of the segment
    void* b = alloc.allocate(300);  // 512: what is left of the hole
    EXPECT_EQ(a, small);
    EXPECT_EQ(b, small + 1024);
    EXPECT_EQ(alloc.stats().allocated, 1024u + 512u + 512u);
    alloc.deallocate(b);
    alloc.deallocate(a);
  }
  EXPECT_EQ(heap.allocations, 1);
  EXPECT_EQ(alloc.stats().allocated, 512u);
  EXPECT_EQ(alloc.stats().reserved, 2u << 20);
  alloc.empty_cache();  // sep is live: the segment stays
  EXPECT_EQ(alloc.stats().reserved, 2u << 20);
  alloc.deallocate(sep);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved, 0u);
  void* c = alloc.allocate(100);
  EXPECT_EQ(heap.allocations, 2);
  EXPECT_EQ(alloc.stats().allocated, 512u);
  alloc.deallocate(c);
}

TEST(CachingAllocator, ReportsAllocatedReservedAndPeak) {
  CountingHeap heap;
  auto alloc = make_allocator(heap);
  void* a = alloc.allocate(4096);
  void* b = alloc.allocate(4 << 20);
  auto s = alloc.stats();
  EXPECT_EQ(s.allocated, 4096u + (4u << 20));
  EXPECT_EQ(s.reserved, (2u << 20) + (20u << 20));  // a small segment and a large one
  alloc.deallocate(b);
  s = alloc.stats();
  EXPECT_EQ(s.allocated, 4096u);
  EXPECT_EQ(s.reserved, (2u << 20) + (20u << 20));
  EXPECT_EQ(s.peak_allocated, 4096u + (4u << 20));
  alloc.empty_cache();  // the large segment is wholly free, the small one holds a
  EXPECT_EQ(alloc.stats().reserved, 2u << 20);
  alloc.deallocate(a);
}

TEST(CachingAllocator, OutOfMemoryNamesRequestedAndFreeBytes) {
  CountingHeap heap;
  heap.limit = 1 << 20;
  auto alloc = make_allocator(heap);
  try {
    alloc.allocate(8 << 20);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("8388608 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1048576 bytes free"), std::string::npos) << msg;
  }
}

TEST(CachingAllocator, RoundsRequestsAndSizesSegments) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) + 1), (1u << 20) + 512u);
  EXPECT_EQ(CachingAllocator::segment_size(1 << 20), 2u << 20);         // the small pool
  EXPECT_EQ(CachingAllocator::segment_size((1 << 20) + 1), 20u << 20);  // the large pool
  EXPECT_EQ(CachingAllocator::segment_size((10 << 20) - 512), 20u << 20);
  EXPECT_EQ(CachingAllocator::segment_size((10 << 20) + 1), 12u << 20);  // its own, by 2 MiB
}

}  // namespace caching_allocator_test
}  // namespace kiln
