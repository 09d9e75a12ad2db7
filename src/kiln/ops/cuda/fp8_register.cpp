// The CUDA FP8 table (one block, beside register_kernels.cpp's table; see fp8_kernels.h).
#include "kiln/ops/cuda/fp8_cuda.h"

namespace kiln::ops {

void register_cuda_fp8_kernels(Fp8Kernels& k) {
  k.quantize = cuda::fp8_quantize;
  k.quantize_transpose = cuda::fp8_quantize_transpose;
  k.dequantize = cuda::fp8_dequantize;
  k.gemm = cuda::fp8_gemm;
  k.gemm_unsupported = cuda::fp8_gemm_unsupported;
}

}  // namespace kiln::ops
