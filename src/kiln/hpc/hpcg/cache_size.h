#pragma once
// The last-level cache a device's kernels see: the bandwidth bound of the report holds only for a
// working set well beyond it (a small problem runs from cache, faster than the memory copy).
#include <cstddef>

#include "kiln/runtime/device.h"

namespace kiln::hpcg {

// Bytes of the CPU's L3 (L2 where there is none) or the GPU's L2; 0 when the system does not say.
std::size_t last_level_cache_bytes(Device device);

// The GPU's L2 (cuda/cache_size.cpp); 0 in builds without CUDA.
std::size_t cuda_l2_cache_bytes(int device_index);

}  // namespace kiln::hpcg
