#include "kiln/runtime/located_error.h"
#include "kiln/runtime/vendor/cudnn.h"
#include "kiln/runtime/vendor/nccl.h"

namespace kiln::vendor {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  auto message = fmt::format("CUDA error {} ({}) in {}", cudaGetErrorName(err), cudaGetErrorString(err), call);
  if (err == cudaErrorMemoryAllocation) throw LocatedOutOfMemoryError(message, file, line);
  throw LocatedError(message, file, line);
}

void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line) {
  throw LocatedError(fmt::format("cuBLAS error {} ({}) in {}", static_cast<int>(st), cublasGetStatusString(st), call),
                     file, line);
}

void throw_cudnn_error(cudnnStatus_t st, const char* call, const char* file, int line) {
  throw LocatedError(fmt::format("cuDNN error {} in {}", cudnnGetErrorString(st), call), file, line);
}

void throw_nccl_error(ncclResult_t st, const char* call, const char* file, int line) {
  throw LocatedError(fmt::format("NCCL error {} in {}", ncclGetErrorString(st), call), file, line);
}

}  // namespace kiln::vendor
