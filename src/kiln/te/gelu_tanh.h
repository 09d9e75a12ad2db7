#pragma once
// GELU with the tanh approximation (PyTorch's approximate='tanh', cuBLASLt's GELU epilogue) and
// its derivative, for the host and the device.
#include <cmath>

#if defined(__CUDACC__)
#define KILN_TE_HD __host__ __device__ __forceinline__
#else
#define KILN_TE_HD inline
#endif

namespace kiln::te {

template <class A>
KILN_TE_HD A gelu_tanh(A x) {
#if !defined(__CUDA_ARCH__)
  using std::tanh;
#endif
  const A k = A(0.7978845608028654);  // sqrt(2 / pi)
  return A(0.5) * x * (A(1) + tanh(k * (x + A(0.044715) * x * x * x)));
}

template <class A>
KILN_TE_HD A gelu_tanh_grad(A x) {
#if !defined(__CUDA_ARCH__)
  using std::tanh;
#endif
  const A k = A(0.7978845608028654);
  const A t = tanh(k * (x + A(0.044715) * x * x * x));
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * k * (A(1) + A(3 * 0.044715) * x * x);
}

}  // namespace kiln::te
