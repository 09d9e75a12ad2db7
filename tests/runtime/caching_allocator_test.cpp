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

// Blocks cycling between the cache and the live set reuse map nodes: best fit, stats and the
// driver-call count must be what they were with fresh nodes, including after empty_cache().
TEST(CachingAllocator, BlocksCyclingThroughTheCacheKeepBestFitAndStats) {
  CountingHeap heap;
  auto alloc = make_allocator(heap);
  void* small = alloc.allocate(512);
  void* mid = alloc.allocate(1024);
  void* big = alloc.allocate(4096);
  alloc.deallocate(big);
  alloc.deallocate(small);
  alloc.deallocate(mid);
  for (int i = 0; i < 100; ++i) {
    void* a = alloc.allocate(700);  // 1024 class: the mid block, never the 4096 one
    void* b = alloc.allocate(300);  // 512 class
    EXPECT_EQ(a, mid);
    EXPECT_EQ(b, small);
    EXPECT_EQ(alloc.stats().allocated, 1536u);
    alloc.deallocate(b);
    alloc.deallocate(a);
  }
  EXPECT_EQ(heap.allocations, 3);
  EXPECT_EQ(alloc.stats().allocated, 0u);
  EXPECT_EQ(alloc.stats().reserved, 512u + 1024u + 4096u);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved, 0u);
  void* c = alloc.allocate(100);
  EXPECT_EQ(heap.allocations, 4);
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
  EXPECT_EQ(s.reserved, s.allocated);
  alloc.deallocate(b);
  s = alloc.stats();
  EXPECT_EQ(s.allocated, 4096u);
  EXPECT_EQ(s.reserved, 4096u + (4u << 20));
  EXPECT_EQ(s.peak_allocated, 4096u + (4u << 20));
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved, 4096u);
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

TEST(CachingAllocator, RoundsSmallAndLargeSizes) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) + 1), 2u << 20);
}

}  // namespace caching_allocator_test
}  // namespace kiln
