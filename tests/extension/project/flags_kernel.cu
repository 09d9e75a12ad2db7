// CUDA code gets DEVICE_FLAGS, not CXX_FLAGS.
#ifndef FROM_DEVICE_FLAGS
#error "DEVICE_FLAGS did not reach nvcc"
#endif
#ifdef FROM_CXX_FLAGS
#error "CXX_FLAGS reached nvcc"
#endif
__global__ void kiln_test_flags_kernel() {}
