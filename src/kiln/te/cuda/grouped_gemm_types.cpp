#include "kiln/te/cuda/grouped_gemm_types.h"

#include "kiln/ops/cuda/cuda_host.h"

namespace kiln::te::cuda {

bool grouped_gemm_types(DType d, cudaDataType_t* type, cublasComputeType_t* compute) {
  switch (d) {
    case DType::BF16: *type = CUDA_R_16BF, *compute = CUBLAS_COMPUTE_32F; return true;
    case DType::F16: *type = CUDA_R_16F, *compute = CUBLAS_COMPUTE_32F; return true;
    case DType::F32:
      *type = CUDA_R_32F;
      *compute = ops::cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      return true;
    default: return false;
  }
}

}  // namespace kiln::te::cuda
