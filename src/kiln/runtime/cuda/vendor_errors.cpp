#include <cstring>

#include "kiln/runtime/vendor/cudnn.h"
#include "kiln/runtime/vendor/nccl.h"

namespace kiln::vendor {

namespace {
const char* short_path(const char* file) {
  const char* shown = std::strstr(file, "src/kiln/");
  return shown ? shown + 4 : file;
}
}  // namespace

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  auto message = fmt::format("CUDA error {} ({}) in {} ({}:{})", cudaGetErrorName(err),
                             cudaGetErrorString(err), call, short_path(file), line);
  if (err == cudaErrorMemoryAllocation) throw OutOfMemoryError(message);
  throw Error(message);
}

void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line) {
  throw Error(fmt::format("cuBLAS error {} ({}) in {} ({}:{})", static_cast<int>(st),
                          cublasGetStatusString(st), call, short_path(file), line));
}

void throw_cudnn_error(cudnnStatus_t st, const char* call, const char* file, int line) {
  throw Error(fmt::format("cuDNN error {} in {} ({}:{})", cudnnGetErrorString(st), call, short_path(file), line));
}

void throw_nccl_error(ncclResult_t st, const char* call, const char* file, int line) {
  throw Error(fmt::format("NCCL error {} in {} ({}:{})", ncclGetErrorString(st), call, short_path(file), line));
}

}  // namespace kiln::vendor
