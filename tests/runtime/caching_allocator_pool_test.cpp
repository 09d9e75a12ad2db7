// Private pools of the caching allocator (what a CUDA graph's capture allocates from): their
// segments' blocks are never handed to allocations outside the pool nor freed to the driver while the pool
// lives, and return to the general cache when it is released.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "kiln/runtime/caching_allocator.h"
#include "kiln/runtime/error.h"

namespace kiln {
namespace caching_allocator_pool_test {

struct Heap {
  int allocations = 0, frees = 0;
};

CachingAllocator make_allocator(Heap& heap) {
  return CachingAllocator(
      "test",
      [&heap](std::size_t n) -> void* {
        ++heap.allocations;
        return std::malloc(n);
      },
      [&heap](void* p) {
        ++heap.frees;
        std::free(p);
      },
      [] { return std::size_t{1} << 30; });
}

TEST(CachingAllocatorPool, CaptureTakesCachedSegmentsAndKeepsThem) {
  Heap heap;
  auto alloc = make_allocator(heap);
  // Warm-up: a small segment ends up wholly free; a large one holds a live block.
  char* w1 = static_cast<char*>(alloc.allocate(1000));
  void* w2 = alloc.allocate(1000);
  void* live_before = alloc.allocate(3 << 20);  // allocated before the capture, freed during it
  alloc.deallocate(w1);
  alloc.deallocate(w2);
  EXPECT_EQ(heap.allocations, 2);

  auto pool = alloc.create_pool();
  alloc.begin_pool(pool);
  void* c1 = alloc.allocate(1000);  // the wholly free segment becomes the pool's: no driver call
  void* c2 = alloc.allocate(1000);  // split off the rest of it
  EXPECT_EQ(c1, w1);
  EXPECT_EQ(heap.allocations, 2);
  alloc.deallocate(c1);             // a temporary of the captured work: stays in the pool
  void* c3 = alloc.allocate(1000);  // reused within the capture
  EXPECT_EQ(c3, c1);
  alloc.deallocate(live_before);  // its segment joins the pool (the capture may reuse it)
  alloc.empty_cache();            // refused while a pool is active: nothing freed
  EXPECT_EQ(heap.frees, 0);
  alloc.end_pool();
  EXPECT_EQ(alloc.pool_segments(pool), 2u);
  EXPECT_EQ(alloc.pool_blocks(pool), 4u);  // c3, c2, the small segment's rest; the large one free

  // Between replays: other allocations never get the pool's memory, live or freed.
  alloc.deallocate(c3);
  auto in_pool = [&](void* p) {
    auto* c = static_cast<char*>(p);
    return (c >= w1 && c < w1 + (2 << 20)) || c == live_before;
  };
  void* other = alloc.allocate(1000);
  EXPECT_FALSE(in_pool(other));
  EXPECT_EQ(heap.allocations, 3);
  void* other_large = alloc.allocate(3 << 20);
  EXPECT_FALSE(in_pool(other_large));
  EXPECT_EQ(heap.allocations, 4);
  alloc.deallocate(other_large);
  alloc.empty_cache();  // frees the general cache's wholly free segment only
  EXPECT_EQ(heap.frees, 1);
  EXPECT_EQ(alloc.pool_segments(pool), 2u);

  // The graph is gone: the pool's segments go to the general cache, live blocks with them.
  alloc.release_pool(pool);
  EXPECT_EQ(alloc.pool_segments(pool), 0u);
  EXPECT_EQ(alloc.pool_blocks(pool), 0u);
  void* again = alloc.allocate(1000);  // the best fit: the 1024-byte hole c1 left
  EXPECT_EQ(again, c1);
  alloc.deallocate(c2);  // was live in the pool: now an ordinary block
  alloc.deallocate(again);
  alloc.deallocate(other);
  alloc.empty_cache();
  EXPECT_EQ(heap.frees, 4);
  EXPECT_EQ(alloc.stats().allocated, 0u);
  EXPECT_EQ(alloc.stats().reserved, 0u);
}

// After an eager warm-up step, the step's temporaries are free holes in segments that also hold
// what outlives the step: the capture takes those holes (their segments become the pool's), so it
// needs no new memory from the driver, as after a warm-up before (docs/CUDA.md).
TEST(CachingAllocatorPool, CaptureTakesHolesOfSegmentsOthersLiveIn) {
  Heap heap;
  auto alloc = make_allocator(heap);
  void* persistent = alloc.allocate(1000);
  void* temporary = alloc.allocate(3000);
  alloc.deallocate(temporary);
  auto pool = alloc.create_pool();
  alloc.begin_pool(pool);
  void* captured = alloc.allocate(3000);
  EXPECT_EQ(captured, temporary);
  EXPECT_EQ(heap.allocations, 1);
  alloc.end_pool();
  EXPECT_EQ(alloc.pool_segments(pool), 1u);
  alloc.deallocate(persistent);  // its segment is the pool's now: so is its memory
  void* other = alloc.allocate(1000);
  EXPECT_NE(other, persistent);
  EXPECT_EQ(heap.allocations, 2);
  alloc.deallocate(other);
  alloc.deallocate(captured);
  alloc.release_pool(pool);
  alloc.empty_cache();
  EXPECT_EQ(heap.frees, 2);
  EXPECT_EQ(alloc.stats().reserved, 0u);
}

TEST(CachingAllocatorPool, NewMemoryDuringCaptureBelongsToThePool) {
  Heap heap;
  auto alloc = make_allocator(heap);
  auto pool = alloc.create_pool();
  alloc.begin_pool(pool);
  EXPECT_THROW(alloc.begin_pool(pool), Error);  // one active pool at a time
  void* a = alloc.allocate(4 << 20);
  EXPECT_EQ(heap.allocations, 1);
  EXPECT_THROW(alloc.release_pool(pool), Error);  // still active
  alloc.end_pool();
  alloc.deallocate(a);
  void* b = alloc.allocate(4 << 20);  // not the pool's block
  EXPECT_NE(a, b);
  alloc.deallocate(b);
  alloc.release_pool(pool);
  alloc.empty_cache();
  EXPECT_EQ(heap.frees, 2);
}

}  // namespace caching_allocator_pool_test
}  // namespace kiln
