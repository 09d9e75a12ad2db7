#pragma once
// cuSOLVER (dense) through the vendor layer. Used by HPL to time cuSOLVER's getrf as its peer.
#include <cusolverDn.h>

#include "kiln/runtime/vendor/cuda.h"

#define KILN_CUSOLVER_CHECK(call)                                                                                  \
  do {                                                                                                             \
    cusolverStatus_t kiln_st_ = (call);                                                                            \
    KILN_CHECK(kiln_st_ == CUSOLVER_STATUS_SUCCESS, "cuSOLVER error {} in {} ({}:{})", static_cast<int>(kiln_st_), \
               #call, __FILE__, __LINE__);                                                                         \
  } while (0)
