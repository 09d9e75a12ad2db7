#pragma once
// Page-locked host memory, so host-to-device copies run at full PCIe/NVLink speed and can be
// asynchronous. Falls back to ordinary aligned memory when no GPU is present.
#include <cstddef>
#include <memory>

namespace kiln {

struct PinnedDeleter {
  bool pinned = false;
  void operator()(void* p) const;
};
using PinnedBuffer = std::unique_ptr<void, PinnedDeleter>;

PinnedBuffer allocate_pinned(std::size_t bytes);

}  // namespace kiln
