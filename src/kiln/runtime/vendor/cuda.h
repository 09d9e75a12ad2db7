#pragma once
// The vendor header: GPU code includes this, never the CUDA headers directly, so that a MUSA build
// swaps one header (musa.h maps the names) instead of editing every kernel file.
#if defined(KILN_VENDOR_MUSA)
#include "kiln/runtime/vendor/musa.h"
#else
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#endif

#include "kiln/runtime/error.h"

namespace kiln::vendor {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line);
}  // namespace kiln::vendor

// Every vendor call is checked; a failure throws kiln::Error with the call, file and line.
#define KILN_CUDA_CHECK(call)                                                          \
  do {                                                                                 \
    cudaError_t kiln_err_ = (call);                                                    \
    if (kiln_err_ != cudaSuccess) [[unlikely]]                                         \
      ::kiln::vendor::throw_cuda_error(kiln_err_, #call, __FILE__, __LINE__);          \
  } while (0)

#define KILN_CUBLAS_CHECK(call)                                                        \
  do {                                                                                 \
    cublasStatus_t kiln_st_ = (call);                                                  \
    if (kiln_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                \
      ::kiln::vendor::throw_cublas_error(kiln_st_, #call, __FILE__, __LINE__);         \
  } while (0)

// After a kernel launch: catches bad launch configurations at the launch site.
#define KILN_CUDA_CHECK_LAUNCH() KILN_CUDA_CHECK(cudaGetLastError())
