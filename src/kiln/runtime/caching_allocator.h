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
//
// Stream order (as PyTorch's CUDA caching allocator): every block belongs to the stream it was
// allocated on, and a freed block is reused only by allocations on that stream, whose later work
// runs after everything the freeing stream had queued. record_stream(ptr, other) says the block is
// also used on `other`: when it is freed, an event is recorded on each such stream, and the block
// is reused only once those events have happened (queried on the next allocations; waited for
// before memory goes back to the driver). Blocks freed with such uses during a private pool's
// capture get their events when the pool ends (an event recorded in a capture cannot be queried).
// The event functions are given like the raw allocate/free, so the CPU tests drive this logic too.
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

  // Opaque stream and event handles of the backend (cudaStream_t, cudaEvent_t on CUDA).
  using StreamKey = void*;
  struct StreamEvents {
    std::function<void*(StreamKey)> record;  // a new event recorded on the stream now
    std::function<bool(void*)> query;        // has the event happened
    std::function<void(void*)> synchronize;  // the host waits for the event
    std::function<void(void*)> destroy;
  };

  // Without `events`, record_stream is refused for streams other than the block's own.
  CachingAllocator(std::string device_name, RawAllocate allocate, RawFree free, FreeBytes free_bytes,
                   StreamEvents events = {});
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block for work on `stream` (reuses only blocks freed from that stream).
  void* allocate(std::size_t bytes, StreamKey stream = nullptr);
  void deallocate(void* ptr);
  // `ptr` (as allocate() returned it, still live) is used by work on `stream` too; see above.
  void record_stream(void* ptr, StreamKey stream);
  std::size_t pending_blocks() const;
  bool is_live(void* ptr)
      const;  // allocate() returned it and it is not freed yet  // freed blocks waiting for other streams (for tests)
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
  // Free blocks are ordered by stream, then size: a best fit is a lower_bound within the stream.
  struct BlockKey {
    std::uintptr_t stream;
    std::size_t size;
    friend auto operator<=>(const BlockKey&, const BlockKey&) = default;
  };
  using FreeBlocks = std::multimap<BlockKey, void*>;
  struct Block {
    std::size_t size = 0;
    std::size_t requested = 0;  // the request's rounded size (a cached block may be up to twice it)
    StreamKey stream = nullptr;
    std::vector<StreamKey> uses;  // other streams that use it (record_stream)
  };
  struct PendingBlock {  // freed, waiting for the events of the streams that used it
    void* ptr;
    Block block;
    std::vector<void*> events;
  };

  void release_cached_locked();
  void* allocate_in_pool_locked(std::size_t size, std::size_t bytes, StreamKey stream);
  void* take_live_locked(FreeBlocks& from, FreeBlocks::iterator it);
  bool deallocate_to_pool_locked(void* ptr, std::size_t size, StreamKey stream);  // false: not a pool's
  void free_block_locked(void* ptr, std::size_t size, StreamKey stream);          // to its pool or the cache
  void process_pending_locked(bool wait);  // pending blocks whose events have happened become free
  PendingBlock record_uses_locked(void* ptr, Block block);
  [[noreturn]] void throw_oom_locked(std::size_t bytes);
  void* adopt_new_block_locked(void* ptr, std::size_t size, StreamKey stream);  // fresh from the driver
  void mark_live_locked(void* ptr, std::size_t size, StreamKey stream);         // handed out
  void insert_live_locked(void* ptr, std::size_t size, StreamKey stream);
  static FreeBlocks::iterator best_fit(FreeBlocks& blocks, std::size_t size, StreamKey stream);

  std::string device_name_;
  RawAllocate raw_allocate_;
  RawFree raw_free_;
  FreeBytes free_bytes_;
  StreamEvents events_;
  mutable std::mutex mutex_;
  FreeBlocks cached_;                      // (stream, size) -> block, free for reuse
  std::unordered_map<void*, Block> live_;  // handed out
  std::vector<PendingBlock> pending_;
  std::vector<std::pair<void*, Block>> deferred_;  // freed with uses while a pool was active
  // Map nodes taken out of cached_ / live_, kept for the next insertion: a block moving between the
  // two maps (every op's output in a steady loop) then costs no heap allocation.
  std::vector<decltype(cached_)::node_type> spare_cached_nodes_;
  std::vector<decltype(live_)::node_type> spare_live_nodes_;
  MemoryStats stats_;
  std::size_t request_ = 0;  // the rounded size of the request being served (under mutex_)
  // Private pools: a pool's free blocks; which pool owns a block (live or free).
  std::unordered_map<PoolId, FreeBlocks> pools_;
  std::unordered_map<void*, PoolId> pool_of_;
  PoolId active_pool_ = 0;  // 0: none
  PoolId next_pool_ = 1;
};

}  // namespace kiln
