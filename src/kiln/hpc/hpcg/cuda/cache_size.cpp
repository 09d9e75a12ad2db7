// The GPU's L2 size, for the report's bandwidth bound (cache_size.h).
#include "kiln/hpc/hpcg/cache_size.h"

#include "kiln/runtime/vendor/cuda.h"

namespace kiln::hpcg {

std::size_t cuda_l2_cache_bytes(int device_index) {
  int bytes = 0;
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device_index) != cudaSuccess || bytes < 0) {
    cudaGetLastError();  // clear the error: an unknown size only leaves the bound unqualified
    return 0;
  }
  return static_cast<std::size_t>(bytes);
}

}  // namespace kiln::hpcg
