#pragma once
// One cuBLASLt matmul with an epilogue (GELU_AUX(_BIAS) forward, DGELU(_BGRAD) backward), on
// Kiln's per-device cuBLASLt handle and workspace (ops/cuda/cublaslt_device.h). Descriptors and
// the heuristic's algorithm are cached per shape, dtype, epilogue and pointer alignment, as
// ops/cuda/gemm.cpp does for plain GEMMs.
#include <cstdint>

#include "kiln/runtime/vendor/cuda.h"
#include "kiln/tensor/dtype.h"

namespace kiln::te::cuda {

// Row-major: d [n, m] = epilogue(b [n, k] @ op(a)), op(a) = a^T for a [m, k] (a_transposed) or a
// for a [k, m]. aux [n, m] is the GELU input (written by GELU_AUX, read by DGELU); bias [m] is
// the bias (read by *_BIAS) or the bias gradient (written by *_BGRAD: column sums of d).
struct LtEpilogueMatmul {
  DType dtype{};
  std::int64_t m = 0, n = 0, k = 0;
  bool a_transposed = false;
  cublasLtEpilogue_t epilogue{};
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  void* aux = nullptr;
  void* bias = nullptr;
};

// Runs the matmul on `stream` of `device`; returns false (running nothing) where cuBLASLt has no
// algorithm for it (the aux leading dimension m must be a multiple of 8), so the caller falls
// back to a plain GEMM and its own epilogue kernel.
bool lt_epilogue_matmul(int device, const LtEpilogueMatmul& call, cudaStream_t stream);

}  // namespace kiln::te::cuda
