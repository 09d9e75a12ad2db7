#pragma once
// cuDNN through the vendor layer (MUSA: muDNN is mapped in musa.h).
#include <cudnn.h>

#include "kiln/runtime/vendor/cuda.h"

namespace kiln::vendor {
[[noreturn]] void throw_cudnn_error(cudnnStatus_t st, const char* call, const char* file, int line);
}

#define KILN_CUDNN_CHECK(call)                                                   \
  do {                                                                           \
    cudnnStatus_t kiln_st_ = (call);                                             \
    if (kiln_st_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                           \
      ::kiln::vendor::throw_cudnn_error(kiln_st_, #call, __FILE__, __LINE__);    \
  } while (0)
