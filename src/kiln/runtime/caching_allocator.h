#pragma once
// CachingAllocator: keeps freed device memory for reuse so a steady training step never calls the
// driver's allocator (cudaMalloc synchronises the device and costs tens of microseconds).
// Backend-neutral: it is given the raw allocate/free functions, so the CPU tests exercise it too.
//
// Segments and blocks (as PyTorch's CUDA caching allocator): memory comes from the driver in
// segments; a request, rounded to 512 B, gets a block carved from the best-fitting free block of a
// segment, and the remainder stays free in that segment. A freed block merges with its free
// neighbours, so a segment whose blocks are all freed is one free block again. Requests up to 1 MiB
// come from the small pool (2 MiB segments), larger ones from the large pool (20 MiB segments for
// requests below 10 MiB, a segment of the request rounded to 2 MiB from there); the two pools keep
// small tensors from fragmenting the large segments. A block is always exactly its rounded request,
// so `MemoryStats::allocated` is what tensors asked for (rounded to 512 B), whatever the order.
//
// Private pools (for CUDA graphs, as PyTorch's graph memory pools): between begin_pool(id) and
// end_pool(), every allocation is served from pool `id` (its segments' free blocks, then a free
// block of the general cache, whose segment becomes the pool's (a wholly free one if any fits),
// then a new segment from the driver) and every block freed joins the pool, with the whole segment
// it lies in. A pool owns whole segments; their blocks
// are never handed to allocations outside the pool and never returned to the driver (not by
// empty_cache, not on an out-of-memory retry), so a captured graph can keep using its memory
// between replays while other work allocates. release_pool(id) (the graph is gone) gives the pool's
// segments back to the general cache; their live blocks return there when freed. While a pool is
// active, nothing is freed to the driver (not allowed during capture).
//
// Stream order (as PyTorch's CUDA caching allocator): every segment belongs to the stream it was
// allocated for, and its free blocks are reused only by allocations on that stream, whose later work
// runs after everything the freeing stream had queued. record_stream(ptr, other) says the block is
// also used on `other`: when it is freed, an event is recorded on each such stream, and the block
// becomes free (reusable, mergeable with its neighbours) only once those events have happened
// (queried on the next allocations; waited for before memory goes back to the driver). Blocks freed
// with such uses during a private pool's capture get their events when the pool ends (an event
// recorded in a capture cannot be queried). The event functions are given like the raw
// allocate/free, so the CPU tests drive this logic too.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
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

  // A block for work on `stream` (carved only from segments of that stream).
  void* allocate(std::size_t bytes, StreamKey stream = nullptr);
  void deallocate(void* ptr);
  // `ptr` (as allocate() returned it, still live) is used by work on `stream` too; see above.
  void record_stream(void* ptr, StreamKey stream);
  std::size_t pending_blocks() const;  // freed blocks waiting for other streams (for tests)
  bool is_live(void* ptr) const;       // allocate() returned it and it is not freed yet
  void empty_cache();                  // frees the general cache's wholly free segments
  MemoryStats stats() const;
  void reset_peak();

  using PoolId = std::uint64_t;
  PoolId create_pool();
  void begin_pool(PoolId pool);  // one pool active at a time
  void end_pool();
  void release_pool(PoolId pool);
  std::size_t pool_blocks(PoolId pool) const;    // blocks in the pool's segments, live or free (for tests)
  std::size_t pool_segments(PoolId pool) const;  // segments the pool owns (for tests)

  // Every request is rounded to 512 B: the size of its block.
  static std::size_t round_size(std::size_t bytes);
  // The size of the segment the driver is asked for when no free block fits a request of `bytes`.
  static std::size_t segment_size(std::size_t bytes);

 private:
  struct Segment;
  struct Block;
  // Free blocks ordered by stream, then size, then address: a best fit is a lower_bound within the
  // stream, and equal sizes are taken lowest address first (deterministic, and it packs segments).
  struct BySize {
    using is_transparent = void;
    struct Key {
      std::uintptr_t stream;
      std::size_t size;
      std::uintptr_t ptr;
    };
    static Key key(const Block* b);
    bool operator()(const Block* a, const Block* b) const;
    bool operator()(const Block* a, const Key& b) const;
    bool operator()(const Key& a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, BySize>;
  struct Block {
    void* ptr = nullptr;
    std::size_t size = 0;
    StreamKey stream = nullptr;  // its segment's, copied here for the free sets' order
    Segment* segment = nullptr;
    Block* prev = nullptr;  // neighbours in the segment, by address
    Block* next = nullptr;
    bool free = false;            // in a free set (allocated and pending blocks are not)
    FreeSet::iterator where;      // its place in that set while free: taken out without a search
    std::vector<StreamKey> uses;  // other streams that use it (record_stream)
  };
  struct FreeSets {  // one per pool (the general cache is pool 0)
    FreeSet small, large;
  };
  struct Segment {
    void* base = nullptr;
    std::size_t size = 0;
    bool large = false;  // in the large pool's free set
    PoolId pool = 0;     // 0: the general cache
    Block* first = nullptr;
  };
  struct PendingBlock {  // freed, waiting for the events of the streams that used it
    Block* block;
    std::vector<void*> events;
  };

  FreeSets& sets_of(PoolId pool);
  FreeSet& free_set_of(const Segment& segment);
  Block* best_fit(FreeSets& sets, std::size_t size, StreamKey stream);
  Block* take_general_segment_locked(std::size_t size, StreamKey stream);  // for the active pool
  Block* new_segment_locked(std::size_t size, StreamKey stream, bool may_release);
  void* hand_out_locked(Block* block, std::size_t size);  // split off the rest, mark it live
  void free_block_locked(Block* block);                   // merge with free neighbours, cache
  void insert_free_locked(Block* block);
  void erase_free_locked(Block* block);
  void move_segment_to_pool_locked(Segment& segment, PoolId pool);
  void release_free_segments_locked(FreeSets& sets);
  void release_cached_locked();
  void process_pending_locked(bool wait);  // pending blocks whose events have happened become free
  PendingBlock record_uses_locked(Block* block);
  [[noreturn]] void throw_oom_locked(std::size_t bytes);
  Block* new_block_locked();
  void recycle_block_locked(Block* block);

  std::string device_name_;
  RawAllocate raw_allocate_;
  RawFree raw_free_;
  FreeBytes free_bytes_;
  StreamEvents events_;
  mutable std::mutex mutex_;
  FreeSets general_;
  std::unordered_map<void*, std::unique_ptr<Segment>> segments_;  // by base address
  std::unordered_map<void*, Block*> live_;                        // handed out
  std::vector<PendingBlock> pending_;
  std::vector<Block*> deferred_;  // freed with uses while a pool was active
  // Block objects and set/map nodes freed by merges and hand-outs, kept for the next split or
  // insertion: a steady loop (every op's output split off a free block, then merged back) then
  // costs no heap allocation.
  std::vector<Block*> spare_blocks_;
  std::vector<FreeSet::node_type> spare_free_nodes_;
  std::vector<decltype(live_)::node_type> spare_live_nodes_;
  MemoryStats stats_;
  std::unordered_map<PoolId, FreeSets> pools_;
  PoolId active_pool_ = 0;  // 0: none
  PoolId next_pool_ = 1;
};

}  // namespace kiln
