#include "kiln/runtime/caching_allocator.h"

#include <algorithm>
#include <tuple>

#include "kiln/runtime/error.h"

namespace kiln {

namespace {
constexpr std::size_t kRound = 512;                   // every block is a multiple of this
constexpr std::size_t kSmallLimit = 1 << 20;          // requests up to this come from the small pool
constexpr std::size_t kSmallSegment = 2 << 20;        // the small pool's segments
constexpr std::size_t kLargeSegment = 20 << 20;       // the large pool's segments for requests below...
constexpr std::size_t kLargeSegmentLimit = 10 << 20;  // ...this; larger requests get their own,
constexpr std::size_t kLargeSegmentRound = 2 << 20;   // rounded to this

std::uintptr_t key_of(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
}  // namespace

std::size_t CachingAllocator::round_size(std::size_t bytes) { return (bytes + kRound - 1) / kRound * kRound; }

std::size_t CachingAllocator::segment_size(std::size_t bytes) {
  const std::size_t size = round_size(bytes);
  if (size <= kSmallLimit) return kSmallSegment;
  if (size < kLargeSegmentLimit) return kLargeSegment;
  return (size + kLargeSegmentRound - 1) / kLargeSegmentRound * kLargeSegmentRound;
}

CachingAllocator::BySize::Key CachingAllocator::BySize::key(const Block* b) {
  return {key_of(b->stream), b->size, key_of(b->ptr)};
}
bool CachingAllocator::BySize::operator()(const Block* a, const Block* b) const { return (*this)(a, key(b)); }
bool CachingAllocator::BySize::operator()(const Block* a, const Key& b) const {
  const Key k = key(a);
  return std::tie(k.stream, k.size, k.ptr) < std::tie(b.stream, b.size, b.ptr);
}
bool CachingAllocator::BySize::operator()(const Key& a, const Block* b) const {
  const Key k = key(b);
  return std::tie(a.stream, a.size, a.ptr) < std::tie(k.stream, k.size, k.ptr);
}

CachingAllocator::CachingAllocator(std::string device_name, RawAllocate allocate, RawFree free, FreeBytes free_bytes,
                                   StreamEvents events)
    : device_name_(std::move(device_name)),
      raw_allocate_(std::move(allocate)),
      raw_free_(std::move(free)),
      free_bytes_(std::move(free_bytes)),
      events_(std::move(events)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
  // Live blocks at exit belong to tensors that outlive the allocator (static objects), and
  // pending ones wait on streams that may be torn down already; the driver reclaims both with
  // the process, so they are left alone rather than freed twice or waited for. Only the host-side
  // bookkeeping goes.
  for (auto& [base, segment] : segments_) {
    for (Block* b = segment->first; b;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
  for (Block* b : spare_blocks_) delete b;
}

CachingAllocator::FreeSets& CachingAllocator::sets_of(PoolId pool) { return pool ? pools_.at(pool) : general_; }

CachingAllocator::FreeSet& CachingAllocator::free_set_of(const Segment& segment) {
  FreeSets& sets = sets_of(segment.pool);
  return segment.large ? sets.large : sets.small;
}

CachingAllocator::Block* CachingAllocator::best_fit(FreeSets& sets, std::size_t size, StreamKey stream) {
  // Any free block of the stream that is large enough: hand_out_locked splits off the rest, so a
  // small request never pins a big block.
  FreeSet& set = size <= kSmallLimit ? sets.small : sets.large;
  auto it = set.lower_bound(BySize::Key{key_of(stream), size, 0});
  if (it != set.end() && (*it)->stream == stream) return *it;
  return nullptr;
}

void* CachingAllocator::allocate(std::size_t bytes, StreamKey stream) {
  if (bytes == 0) return nullptr;
  const std::size_t size = round_size(bytes);
  std::lock_guard lock(mutex_);
  if (!active_pool_ && !pending_.empty()) process_pending_locked(false);
  Block* block = best_fit(sets_of(active_pool_), size, stream);
  if (!block && active_pool_) block = take_general_segment_locked(size, stream);
  // No release of cached segments on failure while a pool is active: freeing is not allowed during
  // capture.
  if (!block) block = new_segment_locked(size, stream, /*may_release=*/active_pool_ == 0);
  if (!block) throw_oom_locked(bytes);
  return hand_out_locked(block, size);
}

CachingAllocator::Block* CachingAllocator::take_general_segment_locked(std::size_t size, StreamKey stream) {
  // A capture after an eager warm-up step finds the step's memory cached (docs/CUDA.md) and takes
  // it, as the allocator always did, rather than new memory from the driver (which the CUDA
  // backend allows in a relaxed capture mode but which makes a graph's pool grow), with the whole
  // segment it lies in: a pool owns whole segments. A wholly free segment first, so that segments
  // other tensors live in stay general while there is a choice; else the best fit, whose
  // segment's live blocks join the pool when they are freed (as blocks freed during a capture do).
  FreeSet& set = size <= kSmallLimit ? general_.small : general_.large;
  const auto first = set.lower_bound(BySize::Key{key_of(stream), size, 0});
  for (auto it = first; it != set.end() && (*it)->stream == stream; ++it) {
    Block* b = *it;
    if (b->prev || b->next) continue;  // part of a segment that other blocks share
    move_segment_to_pool_locked(*b->segment, active_pool_);
    return b;
  }
  if (first == set.end() || (*first)->stream != stream) return nullptr;
  Block* b = *first;
  move_segment_to_pool_locked(*b->segment, active_pool_);
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment_locked(std::size_t size, StreamKey stream, bool may_release) {
  std::size_t bytes = segment_size(size);
  void* ptr = raw_allocate_(bytes);
  if (!ptr && may_release) {
    process_pending_locked(true);  // blocks other streams still use come back once they are done
    release_cached_locked();
    ptr = raw_allocate_(bytes);
  }
  if (!ptr && bytes > size) {
    // The driver cannot give a whole segment: the request alone may still fit (no room to share).
    bytes = size;
    ptr = raw_allocate_(bytes);
  }
  if (!ptr) return nullptr;
  auto segment = std::make_unique<Segment>();
  segment->base = ptr;
  segment->size = bytes;
  segment->large = size > kSmallLimit;
  segment->pool = active_pool_;
  Block* b = new_block_locked();
  b->ptr = ptr;
  b->size = bytes;
  b->stream = stream;
  b->segment = segment.get();
  segment->first = b;
  segments_.emplace(ptr, std::move(segment));
  ++stats_.device_allocations;
  stats_.reserved += bytes;
  return b;
}

void* CachingAllocator::hand_out_locked(Block* block, std::size_t size) {
  if (block->free) erase_free_locked(block);
  if (block->size > size) {
    // Split: the rest stays free in the segment. Sizes are multiples of 512 B, so the rest is at
    // least that. Unlike PyTorch, large blocks are split however small the rest: the rest is as
    // unusable inside the block as outside it until a neighbour is freed and it merges, and
    // splitting keeps `allocated` equal to what tensors asked for, which the simulator predicts.
    Block* rest = new_block_locked();
    rest->ptr = static_cast<char*>(block->ptr) + size;
    rest->size = block->size - size;
    rest->stream = block->stream;
    rest->segment = block->segment;
    rest->prev = block;
    rest->next = block->next;
    if (block->next) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    insert_free_locked(rest);  // its next neighbour is not free: the block it was split from was
  }
  block->uses.clear();
  if (spare_live_nodes_.empty()) {
    live_.emplace(block->ptr, block);
  } else {
    auto node = std::move(spare_live_nodes_.back());
    spare_live_nodes_.pop_back();
    node.key() = block->ptr;
    node.mapped() = block;
    live_.insert(std::move(node));
  }
  stats_.allocated += size;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  stats_.requested += size;
  stats_.peak_requested = std::max(stats_.peak_requested, stats_.requested);
  return block->ptr;
}

void CachingAllocator::free_block_locked(Block* block) {
  // Merge with free neighbours (pending and live ones are not free): a segment never has two free
  // blocks side by side. The lower block survives a merge, so a segment's first block stays.
  block->uses.clear();
  if (block->prev && block->prev->free) {
    Block* prev = block->prev;
    erase_free_locked(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next) block->next->prev = prev;
    recycle_block_locked(block);
    block = prev;
  }
  if (block->next && block->next->free) {
    Block* next = block->next;
    erase_free_locked(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next) next->next->prev = block;
    recycle_block_locked(next);
  }
  insert_free_locked(block);
}

void CachingAllocator::insert_free_locked(Block* block) {
  block->free = true;
  FreeSet& set = free_set_of(*block->segment);
  if (spare_free_nodes_.empty()) {
    block->where = set.insert(block).first;
    return;
  }
  auto node = std::move(spare_free_nodes_.back());
  spare_free_nodes_.pop_back();
  node.value() = block;
  block->where = set.insert(std::move(node)).position;
}

void CachingAllocator::erase_free_locked(Block* block) {
  FreeSet& set = free_set_of(*block->segment);
  spare_free_nodes_.push_back(set.extract(block->where));  // its node serves the next free block
  block->free = false;
}

CachingAllocator::Block* CachingAllocator::new_block_locked() {
  if (spare_blocks_.empty()) return new Block;
  Block* b = spare_blocks_.back();
  spare_blocks_.pop_back();
  return b;
}

void CachingAllocator::recycle_block_locked(Block* block) {
  block->ptr = nullptr;
  block->size = 0;
  block->stream = nullptr;
  block->segment = nullptr;
  block->prev = block->next = nullptr;
  block->free = false;
  block->uses.clear();  // keeps its capacity for the next block's uses
  spare_blocks_.push_back(block);
}

void CachingAllocator::move_segment_to_pool_locked(Segment& segment, PoolId pool) {
  FreeSet& from = free_set_of(segment);
  FreeSets& sets = sets_of(pool);
  FreeSet& to = segment.large ? sets.large : sets.small;
  for (Block* b = segment.first; b; b = b->next)
    if (b->free) b->where = to.insert(from.extract(b->where)).position;
  segment.pool = pool;
}

void CachingAllocator::throw_oom_locked(std::size_t bytes) {
  throw OutOfMemoryError(
      fmt::format("out of memory on {}: tried to allocate {} bytes ({:.2f} MiB); {} bytes free on the device, "
                  "{} bytes allocated by Kiln, {} reserved",
                  device_name_, bytes, bytes / 1048576.0, free_bytes_(), stats_.allocated, stats_.reserved));
}

void CachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  KILN_CHECK(it != live_.end(), "deallocate on {}: pointer {} was not allocated here", device_name_, ptr);
  Block* block = it->second;
  spare_live_nodes_.push_back(live_.extract(it));  // its node serves the next block handed out
  stats_.allocated -= block->size;
  stats_.requested -= block->size;
  // A block freed while a pool is active joins that pool, with its whole segment, even if it was
  // allocated before: the graph being captured may reuse it. A segment of another pool stays its.
  if (active_pool_ && block->segment->pool == 0) move_segment_to_pool_locked(*block->segment, active_pool_);
  if (!block->uses.empty()) {
    // Other streams may still be using it: it waits (pending, not mergeable) until they have passed
    // this point.
    if (active_pool_)
      deferred_.push_back(block);
    else
      pending_.push_back(record_uses_locked(block));
    return;
  }
  free_block_locked(block);
}

void CachingAllocator::record_stream(void* ptr, StreamKey stream) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  KILN_CHECK(it != live_.end(),
             "record_stream on {}: pointer {} is not a live block of this allocator (pass the pointer allocate() "
             "returned, before it is freed)",
             device_name_, ptr);
  Block& block = *it->second;
  if (stream == block.stream) return;  // its own stream orders its reuse already
  KILN_CHECK(events_.record != nullptr, "record_stream on {}: this allocator has no stream events", device_name_);
  if (std::find(block.uses.begin(), block.uses.end(), stream) == block.uses.end()) block.uses.push_back(stream);
}

CachingAllocator::PendingBlock CachingAllocator::record_uses_locked(Block* block) {
  PendingBlock pending{block, {}};
  for (StreamKey use : block->uses) pending.events.push_back(events_.record(use));
  return pending;
}

void CachingAllocator::process_pending_locked(bool wait) {
  // Events recorded inside a capture cannot be queried, and none are pending then anyway (their
  // blocks are deferred); pending blocks from before a capture stay pending until it ends.
  if (active_pool_) return;
  std::erase_if(pending_, [&](PendingBlock& p) {
    for (void* event : p.events) {
      if (wait)
        events_.synchronize(event);
      else if (!events_.query(event))
        return false;
    }
    for (void* event : p.events) events_.destroy(event);
    free_block_locked(p.block);
    return true;
  });
}

bool CachingAllocator::is_live(void* ptr) const {
  std::lock_guard lock(mutex_);
  return live_.count(ptr) != 0;
}

std::size_t CachingAllocator::pending_blocks() const {
  std::lock_guard lock(mutex_);
  return pending_.size() + deferred_.size();
}

CachingAllocator::PoolId CachingAllocator::create_pool() {
  std::lock_guard lock(mutex_);
  const PoolId id = next_pool_++;
  pools_[id];
  return id;
}

void CachingAllocator::begin_pool(PoolId pool) {
  std::lock_guard lock(mutex_);
  KILN_CHECK(pools_.count(pool), "begin_pool on {}: unknown pool {}", device_name_, pool);
  KILN_CHECK(active_pool_ == 0, "begin_pool on {}: pool {} is already active", device_name_, active_pool_);
  process_pending_locked(false);  // events are not queried while the pool is active
  active_pool_ = pool;
}

void CachingAllocator::end_pool() {
  std::lock_guard lock(mutex_);
  active_pool_ = 0;
  // Blocks freed during the capture while other streams used them: their streams' events now.
  for (Block* block : deferred_) pending_.push_back(record_uses_locked(block));
  deferred_.clear();
}

void CachingAllocator::release_pool(PoolId pool) {
  std::lock_guard lock(mutex_);
  if (!pools_.count(pool)) return;
  KILN_CHECK(active_pool_ != pool, "release_pool on {}: pool {} is still active", device_name_, pool);
  // Its segments, free blocks and live ones alike, are the general cache's now.
  for (auto& [base, segment] : segments_)
    if (segment->pool == pool) move_segment_to_pool_locked(*segment, 0);
  pools_.erase(pool);
}

std::size_t CachingAllocator::pool_blocks(PoolId pool) const {
  std::lock_guard lock(mutex_);
  std::size_t blocks = 0;
  for (const auto& [base, segment] : segments_)
    if (segment->pool == pool)
      for (const Block* b = segment->first; b; b = b->next) ++blocks;
  return blocks;
}

std::size_t CachingAllocator::pool_segments(PoolId pool) const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(
      std::count_if(segments_.begin(), segments_.end(), [&](const auto& s) { return s.second->pool == pool; }));
}

void CachingAllocator::release_free_segments_locked(FreeSets& sets) {
  for (FreeSet* set : {&sets.small, &sets.large}) {
    for (auto it = set->begin(); it != set->end();) {
      Block* b = *it;
      if (b->prev || b->next) {  // the segment has live or pending blocks too
        ++it;
        continue;
      }
      raw_free_(b->ptr);
      stats_.reserved -= b->size;
      it = set->erase(it);
      segments_.erase(b->ptr);
      delete b;  // memory goes back: so does its bookkeeping
    }
  }
}

void CachingAllocator::release_cached_locked() {
  release_free_segments_locked(general_);  // a pool's segments stay while the pool lives
  spare_free_nodes_.clear();
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  if (active_pool_) return;  // a graph is being captured: freeing to the driver is not allowed
  process_pending_locked(true);
  release_cached_locked();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_requested = stats_.requested;
}

}  // namespace kiln
