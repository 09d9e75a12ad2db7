#include "kiln/hpc/hpcg/cache_size.h"

#include <unistd.h>

namespace kiln::hpcg {

std::size_t last_level_cache_bytes(Device device) {
  if (device.is_cuda()) return cuda_l2_cache_bytes(device.index);
  // glibc reads these from CPUID / sysfs; containers and some CPUs report 0 or -1 (unknown).
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    long bytes = ::sysconf(name);
    if (bytes > 0) return static_cast<std::size_t>(bytes);
  }
  return 0;
}

#if !KILN_WITH_CUDA
std::size_t cuda_l2_cache_bytes(int) { return 0; }
#endif

}  // namespace kiln::hpcg
