#pragma once
// KILN_MD_HD marks the MD functions that the CPU engine and the GPU kernels share (B-spline
// weights, SETTLE of one water), so both engines run the same arithmetic.
#if defined(__CUDACC__)
#define KILN_MD_HD __host__ __device__ inline
#else
#define KILN_MD_HD inline
#endif
