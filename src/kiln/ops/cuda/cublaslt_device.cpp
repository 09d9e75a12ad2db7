#include "kiln/ops/cuda/cublaslt_device.h"

#include <map>
#include <mutex>
#include <utility>

#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/stream.h"

namespace kiln::ops::cuda {

LtDevice& lt_device(int index) {
  static LtDevice devices[64];
  static std::once_flag once[64];
  KILN_CHECK(index >= 0 && index < 64, "cuBLASLt: device index {} out of range", index);
  std::call_once(once[index], [index] {
    DeviceGuard guard(index);
    KILN_CUBLAS_CHECK(cublasLtCreate(&devices[index].handle));
    devices[index].workspace = backend_for(Device::cuda(index)).allocate(kLtWorkspaceBytes, index);
    devices[index].compute_stream = static_cast<cudaStream_t>(Stream::compute(Device::cuda(index)).handle);
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&devices[index].cc_major, cudaDevAttrComputeCapabilityMajor, index));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&devices[index].cc_minor, cudaDevAttrComputeCapabilityMinor, index));
  });
  return devices[index];
}

void* lt_workspace(int index, cudaStream_t stream) {
  LtDevice& dev = lt_device(index);
  if (stream == dev.compute_stream) return dev.workspace;
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, void*> side;
  std::lock_guard lock(mutex);
  void*& ws = side[{index, stream}];
  if (ws == nullptr) {
    // Straight from the driver, not the caching allocator: a first use inside a graph capture would
    // otherwise take the block from the capture's private pool, which dies with the graph.
    DeviceGuard guard(index);
    RelaxedCaptureMode relaxed;
    KILN_CUDA_CHECK(cudaMalloc(&ws, kLtWorkspaceBytes));
  }
  return ws;
}

}  // namespace kiln::ops::cuda
