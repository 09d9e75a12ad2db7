__global__ void kiln_test_kernel() {}
