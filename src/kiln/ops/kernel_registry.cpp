#include <mutex>

#include "kiln/ops/kernels.h"

namespace kiln::ops {

const Kernels& kernels_for(DeviceKind kind) {
  static Kernels tables[kNumDeviceKinds];
  static std::once_flag once;
  std::call_once(once, [] {
    register_cpu_kernels(tables[static_cast<int>(DeviceKind::CPU)]);
#if KILN_WITH_CUDA
    register_cuda_kernels(tables[static_cast<int>(DeviceKind::CUDA)]);
#endif
  });
  return tables[static_cast<int>(kind)];
}

}  // namespace kiln::ops
