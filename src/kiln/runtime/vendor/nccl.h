#pragma once
// NCCL through the vendor layer (MUSA: MCCL is mapped in musa.h).
#include <nccl.h>

#include "kiln/runtime/vendor/cuda.h"

namespace kiln::vendor {
[[noreturn]] void throw_nccl_error(ncclResult_t st, const char* call, const char* file, int line);
}

#define KILN_NCCL_CHECK(call)                                                  \
  do {                                                                         \
    ncclResult_t kiln_st_ = (call);                                            \
    if (kiln_st_ != ncclSuccess) [[unlikely]]                                  \
      ::kiln::vendor::throw_nccl_error(kiln_st_, #call, __FILE__, __LINE__);   \
  } while (0)
