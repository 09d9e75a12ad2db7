// A .cpp under FORCE_DEVICE_COMPILER: compiled by nvcc, with DEVICE_FLAGS.
#ifndef __CUDACC__
#error "FORCE_DEVICE_COMPILER did not send this file to nvcc"
#endif
#ifndef FROM_DEVICE_FLAGS
#error "DEVICE_FLAGS did not reach a forced source"
#endif
#ifdef FROM_CXX_FLAGS
#error "CXX_FLAGS reached a forced source"
#endif
__global__ void kiln_test_forced_kernel() {}
