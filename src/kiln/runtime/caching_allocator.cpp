#include "kiln/runtime/caching_allocator.h"

#include <algorithm>

#include "kiln/runtime/error.h"

namespace kiln {

namespace {
constexpr std::size_t kSmallLimit = 1 << 20;
constexpr std::size_t kSmallRound = 512;
constexpr std::size_t kLargeRound = 2 << 20;

std::uintptr_t key_of(CachingAllocator::StreamKey stream) { return reinterpret_cast<std::uintptr_t>(stream); }
}  // namespace

std::size_t CachingAllocator::round_size(std::size_t bytes) {
  std::size_t unit = bytes <= kSmallLimit ? kSmallRound : kLargeRound;
  return (bytes + unit - 1) / unit * unit;
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
  // the process, so they are left alone rather than freed twice or waited for.
}

CachingAllocator::FreeBlocks::iterator CachingAllocator::best_fit(FreeBlocks& blocks, std::size_t size,
                                                                  StreamKey stream) {
  // Best fit among the stream's free blocks, but never more than twice the request, so a small
  // tensor does not pin a huge block.
  auto it = blocks.lower_bound({key_of(stream), size});
  if (it != blocks.end() && it->first.stream == key_of(stream) && it->first.size <= 2 * size) return it;
  return blocks.end();
}

void* CachingAllocator::allocate(std::size_t bytes, StreamKey stream) {
  if (bytes == 0) return nullptr;
  std::size_t size = round_size(bytes);
  std::lock_guard lock(mutex_);
  request_ = size;  // the block handed out below may be a cached one of up to twice this
  if (active_pool_) return allocate_in_pool_locked(size, bytes, stream);
  if (!pending_.empty()) process_pending_locked(false);
  if (auto it = best_fit(cached_, size, stream); it != cached_.end()) return take_live_locked(cached_, it);
  void* ptr = raw_allocate_(size);
  if (!ptr) {
    process_pending_locked(true);  // blocks other streams still use come back once they are done
    release_cached_locked();
    ptr = raw_allocate_(size);
  }
  if (!ptr) throw_oom_locked(bytes);
  return adopt_new_block_locked(ptr, size, stream);
}

void* CachingAllocator::take_live_locked(FreeBlocks& from, FreeBlocks::iterator it) {
  const std::size_t size = it->first.size;
  const auto stream = reinterpret_cast<StreamKey>(it->first.stream);
  void* ptr = it->second;
  if (&from == &cached_)
    spare_cached_nodes_.push_back(cached_.extract(it));  // its node serves the next block cached
  else
    from.erase(it);
  mark_live_locked(ptr, size, stream);
  return ptr;
}

void* CachingAllocator::adopt_new_block_locked(void* ptr, std::size_t size, StreamKey stream) {
  ++stats_.device_allocations;
  stats_.reserved += size;
  mark_live_locked(ptr, size, stream);
  return ptr;
}

void CachingAllocator::mark_live_locked(void* ptr, std::size_t size, StreamKey stream) {
  insert_live_locked(ptr, size, stream);
  stats_.allocated += size;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  stats_.requested += request_;
  stats_.peak_requested = std::max(stats_.peak_requested, stats_.requested);
}

void CachingAllocator::throw_oom_locked(std::size_t bytes) {
  throw OutOfMemoryError(
      fmt::format("out of memory on {}: tried to allocate {} bytes ({:.2f} MiB); {} bytes free on the device, "
                  "{} bytes allocated by Kiln, {} reserved",
                  device_name_, bytes, bytes / 1048576.0, free_bytes_(), stats_.allocated, stats_.reserved));
}

void* CachingAllocator::allocate_in_pool_locked(std::size_t size, std::size_t bytes, StreamKey stream) {
  auto& pool = pools_.at(active_pool_);
  // The pool's own free blocks first, then a general cached block (now the pool's), then the
  // driver. No release of cached blocks on failure: freeing is not allowed during capture.
  if (auto it = best_fit(pool, size, stream); it != pool.end()) return take_live_locked(pool, it);
  if (auto c = best_fit(cached_, size, stream); c != cached_.end()) {
    pool_of_[c->second] = active_pool_;
    return take_live_locked(cached_, c);
  }
  void* ptr = raw_allocate_(size);
  if (!ptr) throw_oom_locked(bytes);
  pool_of_[ptr] = active_pool_;
  return adopt_new_block_locked(ptr, size, stream);
}

void CachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  KILN_CHECK(it != live_.end(), "deallocate on {}: pointer {} was not allocated here", device_name_, ptr);
  const std::size_t size = it->second.size;
  const StreamKey stream = it->second.stream;
  stats_.allocated -= size;
  stats_.requested -= it->second.requested;
  if (!it->second.uses.empty()) {
    // Other streams may still be using it: it waits (pending) until they have passed this point.
    if (active_pool_ && !pool_of_.count(ptr)) pool_of_[ptr] = active_pool_;  // as below: the graph's now
    Block block = std::move(it->second);
    live_.erase(it);
    if (active_pool_)
      deferred_.emplace_back(ptr, std::move(block));
    else
      pending_.push_back(record_uses_locked(ptr, std::move(block)));
    return;
  }
  spare_live_nodes_.push_back(live_.extract(it));  // its node serves the next block handed out
  free_block_locked(ptr, size, stream);
}

void CachingAllocator::free_block_locked(void* ptr, std::size_t size, StreamKey stream) {
  if ((active_pool_ || !pool_of_.empty()) && deallocate_to_pool_locked(ptr, size, stream)) return;
  if (spare_cached_nodes_.empty()) {
    cached_.emplace(BlockKey{key_of(stream), size}, ptr);
  } else {
    auto node = std::move(spare_cached_nodes_.back());
    spare_cached_nodes_.pop_back();
    node.key() = {key_of(stream), size};
    node.mapped() = ptr;
    cached_.insert(std::move(node));
  }
}

void CachingAllocator::insert_live_locked(void* ptr, std::size_t size, StreamKey stream) {
  if (spare_live_nodes_.empty()) {
    live_.emplace(ptr, Block{size, request_, stream, {}});
    return;
  }
  auto node = std::move(spare_live_nodes_.back());
  spare_live_nodes_.pop_back();
  node.key() = ptr;
  node.mapped().size = size;
  node.mapped().requested = request_;
  node.mapped().stream = stream;
  node.mapped().uses.clear();
  live_.insert(std::move(node));
}

bool CachingAllocator::deallocate_to_pool_locked(void* ptr, std::size_t size, StreamKey stream) {
  // A pool's block goes back to its pool. A block freed while a pool is active joins that pool
  // even if it was allocated before: the graph being captured may reuse it.
  PoolId owner = active_pool_;
  if (auto p = pool_of_.find(ptr); p != pool_of_.end()) owner = p->second;
  if (!owner) return false;
  pool_of_[ptr] = owner;
  pools_.at(owner).emplace(BlockKey{key_of(stream), size}, ptr);
  return true;
}

void CachingAllocator::record_stream(void* ptr, StreamKey stream) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  KILN_CHECK(it != live_.end(),
             "record_stream on {}: pointer {} is not a live block of this allocator (pass the pointer allocate() "
             "returned, before it is freed)",
             device_name_, ptr);
  Block& block = it->second;
  if (stream == block.stream) return;  // its own stream orders its reuse already
  KILN_CHECK(events_.record != nullptr, "record_stream on {}: this allocator has no stream events", device_name_);
  if (std::find(block.uses.begin(), block.uses.end(), stream) == block.uses.end()) block.uses.push_back(stream);
}

CachingAllocator::PendingBlock CachingAllocator::record_uses_locked(void* ptr, Block block) {
  PendingBlock pending{ptr, std::move(block), {}};
  for (StreamKey use : pending.block.uses) pending.events.push_back(events_.record(use));
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
    free_block_locked(p.ptr, p.block.size, p.block.stream);
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
  for (auto& [ptr, block] : deferred_) pending_.push_back(record_uses_locked(ptr, std::move(block)));
  deferred_.clear();
}

void CachingAllocator::release_pool(PoolId pool) {
  std::lock_guard lock(mutex_);
  auto p = pools_.find(pool);
  if (p == pools_.end()) return;
  KILN_CHECK(active_pool_ != pool, "release_pool on {}: pool {} is still active", device_name_, pool);
  for (auto& [key, ptr] : p->second) cached_.emplace(key, ptr);
  pools_.erase(p);
  std::erase_if(pool_of_, [&](const auto& e) { return e.second == pool; });  // live ones: general now
}

std::size_t CachingAllocator::pool_blocks(PoolId pool) const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(
      std::count_if(pool_of_.begin(), pool_of_.end(), [&](const auto& e) { return e.second == pool; }));
}

void CachingAllocator::release_cached_locked() {
  for (auto& [key, ptr] : cached_) {
    raw_free_(ptr);
    stats_.reserved -= key.size;
  }
  cached_.clear();
  spare_cached_nodes_.clear();
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
