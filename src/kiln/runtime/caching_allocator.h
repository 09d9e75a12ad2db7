#pragma once
// CachingAllocator: keeps freed device blocks for reuse so a steady training step never calls the
// driver's allocator (cudaMalloc synchronises the device and costs tens of microseconds).
// Backend-neutral: it is given the raw allocate/free functions, so the CPU tests exercise it too.
//
// Private pools (for CUDA graphs, as PyTorch's graph memory pools): between begin_pool(id) and
// end_pool(), every allocation is served from pool `id` (its own free blocks, then blocks taken
// from the general cache, then the driver) and every block freed goes to the pool. Pool blocks
// are never handed to allocations outside the pool and never returned to the driver (not by
// empty_cache, not on an out-of-memory retry), so a captured graph can keep using its memory
// between replays while other work allocates. release_pool(id) (the graph is gone) gives the
// pool's free blocks back to the general cache; its live blocks return there when freed. While a
// pool is active, nothing is freed to the driver (not allowed during capture).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kiln/runtime/backend.h"

namespace kiln {

class CachingAllocator {
 public:
  using RawAllocate = std::function<void*(std::size_t)>;  // returns nullptr when out of memory
  using RawFree = std::function<void(void*)>;
  using FreeBytes = std::function<std::size_t()>;  // what the driver still has, for OOM messages

  CachingAllocator(std::string device_name, RawAllocate allocate, RawFree free, FreeBytes free_bytes);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(std::size_t bytes);
  void deallocate(void* ptr);
  void empty_cache();
  MemoryStats stats() const;
  void reset_peak();

  using PoolId = std::uint64_t;
  PoolId create_pool();
  void begin_pool(PoolId pool);  // one pool active at a time
  void end_pool();
  void release_pool(PoolId pool);
  std::size_t pool_blocks(PoolId pool) const;  // blocks the pool owns, live or free (for tests)

  // Small requests are rounded to 512 B, large ones to 2 MiB, so freed blocks fit later requests.
  static std::size_t round_size(std::size_t bytes);

 private:
  void release_cached_locked();
  void* allocate_in_pool_locked(std::size_t size, std::size_t bytes);
  void* take_live_locked(std::multimap<std::size_t, void*>& from, std::multimap<std::size_t, void*>::iterator it);
  bool deallocate_to_pool_locked(void* ptr, std::size_t size);  // false: the block is not a pool's
  [[noreturn]] void throw_oom_locked(std::size_t bytes);
  void* adopt_new_block_locked(void* ptr, std::size_t size);  // a block fresh from the driver
  void mark_live_locked(void* ptr, std::size_t size);         // handed out: live map and stats
  void insert_live_locked(void* ptr, std::size_t size);

  std::string device_name_;
  RawAllocate raw_allocate_;
  RawFree raw_free_;
  FreeBytes free_bytes_;
  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> cached_;     // size -> block, free for reuse
  std::unordered_map<void*, std::size_t> live_;  // block -> size, handed out
  // Map nodes taken out of cached_ / live_, kept for the next insertion: a block moving between the
  // two maps (every op's output in a steady loop) then costs no heap allocation.
  std::vector<decltype(cached_)::node_type> spare_cached_nodes_;
  std::vector<decltype(live_)::node_type> spare_live_nodes_;
  MemoryStats stats_;
  // Private pools: a pool's free blocks; which pool owns a block (live or free).
  std::unordered_map<PoolId, std::multimap<std::size_t, void*>> pools_;
  std::unordered_map<void*, PoolId> pool_of_;
  PoolId active_pool_ = 0;  // 0: none
  PoolId next_pool_ = 1;
};

}  // namespace kiln
