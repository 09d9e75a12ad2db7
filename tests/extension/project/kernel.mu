// MUSA code: compiled by mcc with DEVICE_FLAGS, Kiln's include directories and definitions.
#include "kiln_test/marker.h"
#ifndef KILN_VENDOR_MUSA
#error "KILN_VENDOR_MUSA is not defined for MUSA code"
#endif
#if !defined(KILN_WITH_CUDA) || !defined(KILN_TEST_MARKER)
#error "Kiln's interface definitions or include directories did not reach mcc"
#endif
#ifndef FROM_DEVICE_FLAGS
#error "DEVICE_FLAGS did not reach mcc"
#endif
#ifdef FROM_CXX_FLAGS
#error "CXX_FLAGS reached mcc"
#endif
int kiln_test_musa() { return 1; }
