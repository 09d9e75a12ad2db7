#include "kiln/runtime/caching_allocator.h"

#include <algorithm>

#include "kiln/runtime/error.h"

namespace kiln {

namespace {
constexpr std::size_t kSmallLimit = 1 << 20;
constexpr std::size_t kSmallRound = 512;
constexpr std::size_t kLargeRound = 2 << 20;
}  // namespace

std::size_t CachingAllocator::round_size(std::size_t bytes) {
  std::size_t unit = bytes <= kSmallLimit ? kSmallRound : kLargeRound;
  return (bytes + unit - 1) / unit * unit;
}

CachingAllocator::CachingAllocator(std::string device_name, RawAllocate allocate, RawFree free, FreeBytes free_bytes)
    : device_name_(std::move(device_name)),
      raw_allocate_(std::move(allocate)),
      raw_free_(std::move(free)),
      free_bytes_(std::move(free_bytes)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
  // Live blocks at exit belong to tensors that outlive the allocator (static objects); the
  // driver reclaims them with the process, so they are left alone rather than freed twice.
}

void* CachingAllocator::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  std::size_t size = round_size(bytes);
  std::lock_guard lock(mutex_);
  if (active_pool_) return allocate_in_pool_locked(size, bytes);
  // Best fit among cached blocks, but never more than twice the request, so a small tensor does
  // not pin a huge block.
  auto it = cached_.lower_bound(size);
  if (it != cached_.end() && it->first <= 2 * size) return take_live_locked(cached_, it);
  void* ptr = raw_allocate_(size);
  if (!ptr) {
    release_cached_locked();
    ptr = raw_allocate_(size);
  }
  if (!ptr) throw_oom_locked(bytes);
  return adopt_new_block_locked(ptr, size);
}

void* CachingAllocator::take_live_locked(std::multimap<std::size_t, void*>& from,
                                         std::multimap<std::size_t, void*>::iterator it) {
  const std::size_t size = it->first;
  void* ptr = it->second;
  if (&from == &cached_)
    spare_cached_nodes_.push_back(cached_.extract(it));  // its node serves the next block cached
  else
    from.erase(it);
  mark_live_locked(ptr, size);
  return ptr;
}

void* CachingAllocator::adopt_new_block_locked(void* ptr, std::size_t size) {
  ++stats_.device_allocations;
  stats_.reserved += size;
  mark_live_locked(ptr, size);
  return ptr;
}

void CachingAllocator::mark_live_locked(void* ptr, std::size_t size) {
  insert_live_locked(ptr, size);
  stats_.allocated += size;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
}

void CachingAllocator::throw_oom_locked(std::size_t bytes) {
  throw OutOfMemoryError(
      fmt::format("out of memory on {}: tried to allocate {} bytes ({:.2f} MiB); {} bytes free on the device, "
                  "{} bytes allocated by Kiln, {} reserved",
                  device_name_, bytes, bytes / 1048576.0, free_bytes_(), stats_.allocated, stats_.reserved));
}

void* CachingAllocator::allocate_in_pool_locked(std::size_t size, std::size_t bytes) {
  auto& pool = pools_.at(active_pool_);
  // The pool's own free blocks first, then a general cached block (now the pool's), then the
  // driver. No release of cached blocks on failure: freeing is not allowed during capture.
  auto it = pool.lower_bound(size);
  if (it != pool.end() && it->first <= 2 * size) return take_live_locked(pool, it);
  auto c = cached_.lower_bound(size);
  if (c != cached_.end() && c->first <= 2 * size) {
    pool_of_[c->second] = active_pool_;
    return take_live_locked(cached_, c);
  }
  void* ptr = raw_allocate_(size);
  if (!ptr) throw_oom_locked(bytes);
  pool_of_[ptr] = active_pool_;
  return adopt_new_block_locked(ptr, size);
}

void CachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  KILN_CHECK(it != live_.end(), "deallocate on {}: pointer {} was not allocated here", device_name_, ptr);
  const std::size_t size = it->second;
  stats_.allocated -= size;
  if ((active_pool_ || !pool_of_.empty()) && deallocate_to_pool_locked(ptr, size)) {
    live_.erase(it);
    return;
  }
  spare_live_nodes_.push_back(live_.extract(it));
  if (spare_cached_nodes_.empty()) {
    cached_.emplace(size, ptr);
  } else {
    auto node = std::move(spare_cached_nodes_.back());
    spare_cached_nodes_.pop_back();
    node.key() = size;
    node.mapped() = ptr;
    cached_.insert(std::move(node));
  }
}

void CachingAllocator::insert_live_locked(void* ptr, std::size_t size) {
  if (spare_live_nodes_.empty()) {
    live_.emplace(ptr, size);
    return;
  }
  auto node = std::move(spare_live_nodes_.back());
  spare_live_nodes_.pop_back();
  node.key() = ptr;
  node.mapped() = size;
  live_.insert(std::move(node));
}

bool CachingAllocator::deallocate_to_pool_locked(void* ptr, std::size_t size) {
  // A pool's block goes back to its pool. A block freed while a pool is active joins that pool
  // even if it was allocated before: the graph being captured may reuse it.
  PoolId owner = active_pool_;
  if (auto p = pool_of_.find(ptr); p != pool_of_.end()) owner = p->second;
  if (!owner) return false;
  pool_of_[ptr] = owner;
  pools_.at(owner).emplace(size, ptr);
  return true;
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
  active_pool_ = pool;
}

void CachingAllocator::end_pool() {
  std::lock_guard lock(mutex_);
  active_pool_ = 0;
}

void CachingAllocator::release_pool(PoolId pool) {
  std::lock_guard lock(mutex_);
  auto p = pools_.find(pool);
  if (p == pools_.end()) return;
  KILN_CHECK(active_pool_ != pool, "release_pool on {}: pool {} is still active", device_name_, pool);
  for (auto& [size, ptr] : p->second) cached_.emplace(size, ptr);
  pools_.erase(p);
  std::erase_if(pool_of_, [&](const auto& e) { return e.second == pool; });  // live ones: general now
}

std::size_t CachingAllocator::pool_blocks(PoolId pool) const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(
      std::count_if(pool_of_.begin(), pool_of_.end(), [&](const auto& e) { return e.second == pool; }));
}

void CachingAllocator::release_cached_locked() {
  for (auto& [size, ptr] : cached_) {
    raw_free_(ptr);
    stats_.reserved -= size;
  }
  cached_.clear();
  spare_cached_nodes_.clear();
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  if (active_pool_) return;  // a graph is being captured: freeing to the driver is not allowed
  release_cached_locked();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated = stats_.allocated;
}

}  // namespace kiln
