// Private pools of the caching allocator (what a CUDA graph's capture allocates from): their
// blocks are never handed to allocations outside the pool nor freed to the driver while the pool
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

TEST(CachingAllocatorPool, CaptureTakesCachedBlocksAndKeepsThem) {
  Heap heap;
  auto alloc = make_allocator(heap);
  // Warm-up: two blocks end up cached.
  void* w1 = alloc.allocate(1000);
  void* w2 = alloc.allocate(1000);
  void* live_before = alloc.allocate(1000);  // allocated before the capture, freed during it
  alloc.deallocate(w1);
  alloc.deallocate(w2);
  EXPECT_EQ(heap.allocations, 3);

  auto pool = alloc.create_pool();
  alloc.begin_pool(pool);
  void* c1 = alloc.allocate(1000);  // taken from the general cache: no driver call
  void* c2 = alloc.allocate(1000);
  EXPECT_EQ(heap.allocations, 3);
  alloc.deallocate(c1);             // a temporary of the captured work: stays in the pool
  void* c3 = alloc.allocate(1000);  // reused within the capture
  EXPECT_EQ(c3, c1);
  alloc.deallocate(live_before);  // joins the pool (the capture may reuse it)
  alloc.empty_cache();            // refused while a pool is active: nothing freed
  EXPECT_EQ(heap.frees, 0);
  alloc.end_pool();
  EXPECT_EQ(alloc.pool_blocks(pool), 3u);

  // Between replays: other allocations never get the pool's blocks, live or freed.
  alloc.deallocate(c3);
  std::set<void*> pool_blocks{c1, c2, live_before};
  void* other = alloc.allocate(1000);
  EXPECT_FALSE(pool_blocks.count(other));
  EXPECT_EQ(heap.allocations, 4);
  alloc.empty_cache();  // frees the general cache only
  EXPECT_EQ(heap.frees, 0);
  EXPECT_EQ(alloc.pool_blocks(pool), 3u);

  // The graph is gone: free pool blocks go to the general cache, live ones when freed.
  alloc.release_pool(pool);
  EXPECT_EQ(alloc.pool_blocks(pool), 0u);
  void* again = alloc.allocate(1000);
  EXPECT_TRUE(pool_blocks.count(again));
  alloc.deallocate(c2);  // was live in the pool: now an ordinary block
  alloc.deallocate(again);
  alloc.deallocate(other);
  alloc.empty_cache();
  EXPECT_EQ(heap.frees, 4);
  EXPECT_EQ(alloc.stats().allocated, 0u);
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
