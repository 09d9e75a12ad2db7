#pragma once
// The cuBLAS data and compute types of the experts' grouped GEMMs (te/cuda/grouped_gemm_cublas.cpp's
// cublasGemmGroupedBatchedEx call, te/cuda/grouped_gemm_chunked.cpp's pointer-array batches): bf16
// and f16 accumulate in f32, f32 runs in true FP32 (TF32 with KILN_ALLOW_TF32=1); f32 scales for all.
#include "kiln/runtime/vendor/cuda.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te::cuda {

// False, leaving *type and *compute as they were, for any other dtype (the callers' loop takes it).
bool grouped_gemm_types(DType d, cudaDataType_t* type, cublasComputeType_t* compute);

}  // namespace kiln::te::cuda
