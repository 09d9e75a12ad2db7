#include "kiln/ops/kernels.h"

namespace kiln::ops {

namespace {
struct KernelTables {
  Kernels tables[kNumDeviceKinds];
  KernelTables() {
    register_cpu_kernels(tables[static_cast<int>(DeviceKind::CPU)]);
#if KILN_WITH_CUDA
    register_cuda_kernels(tables[static_cast<int>(DeviceKind::CUDA)]);
#endif
  }
};
}  // namespace

const Kernels& kernels_for(DeviceKind kind) {
  // Looked up on every op: a function-local static is one inline guard load after the first call,
  // where std::call_once calls into libstdc++ and pthread_once each time.
  static const KernelTables k;
  return k.tables[static_cast<int>(kind)];
}

}  // namespace kiln::ops
