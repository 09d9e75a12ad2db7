#include "kiln/ops/cuda/cublaslt_device.h"

#include <mutex>

#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"

namespace kiln::ops::cuda {

LtDevice& lt_device(int index) {
  static LtDevice devices[64];
  static std::once_flag once[64];
  KILN_CHECK(index >= 0 && index < 64, "cuBLASLt: device index {} out of range", index);
  std::call_once(once[index], [index] {
    DeviceGuard guard(index);
    KILN_CUBLAS_CHECK(cublasLtCreate(&devices[index].handle));
    devices[index].workspace = backend_for(Device::cuda(index)).allocate(kLtWorkspaceBytes, index);
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&devices[index].cc_major, cudaDevAttrComputeCapabilityMajor, index));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&devices[index].cc_minor, cudaDevAttrComputeCapabilityMinor, index));
  });
  return devices[index];
}

}  // namespace kiln::ops::cuda
