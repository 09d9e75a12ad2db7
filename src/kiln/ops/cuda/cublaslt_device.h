#pragma once
// One cuBLASLt handle per CUDA device, shared by every cuBLASLt GEMM (gemm.cpp, fp8_gemm.cpp,
// te/cuda/lt_epilogue.cpp), and one workspace per stream the GEMMs run on: GEMMs that share a
// workspace must be ordered, and a stream orders its own work only: a GEMM under a StreamGuard
// (runtime/stream.h) that used the compute stream's workspace would race with the GEMMs there.
#include <cstddef>

#include "kiln/runtime/vendor/cuda.h"

namespace kiln::ops::cuda {

inline constexpr std::size_t kLtWorkspaceBytes = 32u << 20;

struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;              // kLtWorkspaceBytes, for the device's compute stream
  cudaStream_t compute_stream = nullptr;  // that stream (the backend keeps it for the process)
  int cc_major = 0, cc_minor = 0;
};

// Made on first use (the handle, the workspace from the caching allocator, the compute stream, the
// compute capability).
LtDevice& lt_device(int index);

// The kLtWorkspaceBytes workspace for GEMMs launched on `stream` of cuda:index: the device's own for
// its compute stream, else one per stream, made on first use and held for the process (the side
// streams are the backend's pool: a few per device, living as long).
void* lt_workspace(int index, cudaStream_t stream);

}  // namespace kiln::ops::cuda
