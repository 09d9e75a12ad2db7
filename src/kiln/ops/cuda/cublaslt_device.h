#pragma once
// One cuBLASLt handle and one workspace per CUDA device, shared by every cuBLASLt GEMM (gemm.cpp,
// fp8_gemm.cpp). The workspace is used on Kiln's stream of the device only, so GEMMs that share it
// are ordered by that stream.
#include <cstddef>

#include "kiln/runtime/vendor/cuda.h"

namespace kiln::ops::cuda {

inline constexpr std::size_t kLtWorkspaceBytes = 32u << 20;

struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // kLtWorkspaceBytes
  int cc_major = 0, cc_minor = 0;
};

// Made on first use (the handle, the workspace from the caching allocator, the compute capability).
LtDevice& lt_device(int index);

}  // namespace kiln::ops::cuda
