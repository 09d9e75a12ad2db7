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
  // Best fit among cached blocks, but never more than twice the request, so a small tensor does
  // not pin a huge block.
  auto it = cached_.lower_bound(size);
  if (it != cached_.end() && it->first <= 2 * size) {
    size = it->first;
    void* ptr = it->second;
    spare_cached_nodes_.push_back(cached_.extract(it));
    insert_live_locked(ptr, size);
    stats_.allocated += size;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    return ptr;
  }
  void* ptr = raw_allocate_(size);
  if (!ptr) {
    release_cached_locked();
    ptr = raw_allocate_(size);
  }
  if (!ptr) {
    throw OutOfMemoryError(
        fmt::format("out of memory on {}: tried to allocate {} bytes ({:.2f} MiB); {} bytes free on the device, "
                    "{} bytes allocated by Kiln, {} reserved",
                    device_name_, bytes, bytes / 1048576.0, free_bytes_(), stats_.allocated, stats_.reserved));
  }
  ++stats_.device_allocations;
  stats_.reserved += size;
  insert_live_locked(ptr, size);
  stats_.allocated += size;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  return ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  KILN_CHECK(it != live_.end(), "deallocate on {}: pointer {} was not allocated here", device_name_, ptr);
  const std::size_t size = it->second;
  stats_.allocated -= size;
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
