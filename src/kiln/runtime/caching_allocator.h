#pragma once
// CachingAllocator: keeps freed device blocks for reuse so a steady training step never calls the
// driver's allocator (cudaMalloc synchronises the device and costs tens of microseconds).
// Backend-neutral: it is given the raw allocate/free functions, so the CPU tests exercise it too.
#include <cstddef>
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

  // Small requests are rounded to 512 B, large ones to 2 MiB, so freed blocks fit later requests.
  static std::size_t round_size(std::size_t bytes);

 private:
  void release_cached_locked();
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
};

}  // namespace kiln
