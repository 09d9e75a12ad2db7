#pragma once
// cuSPARSE through the vendor layer: kernels that compare against (or use) cuSPARSE include this,
// never <cusparse.h> directly, and check every call.
#include <cusparse.h>

#include "kiln/runtime/vendor/cuda.h"

namespace kiln::vendor {
[[noreturn]] inline void throw_cusparse_error(cusparseStatus_t st, const char* call, const char* file, int line) {
  ::kiln::detail::throw_error(fmt::format("{} failed: {} ({})", call, cusparseGetErrorString(st), static_cast<int>(st)),
                              file, line);
}
}  // namespace kiln::vendor

#define KILN_CUSPARSE_CHECK(call)                                                \
  do {                                                                           \
    cusparseStatus_t kiln_st_ = (call);                                          \
    if (kiln_st_ != CUSPARSE_STATUS_SUCCESS) [[unlikely]]                        \
      ::kiln::vendor::throw_cusparse_error(kiln_st_, #call, __FILE__, __LINE__); \
  } while (0)
