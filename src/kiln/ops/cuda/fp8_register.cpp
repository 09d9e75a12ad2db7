// The CUDA FP8 kernels into the kernel registry (the FP8 family: see fp8_kernels.h).
#include "kiln/ops/cuda/fp8_cuda.h"

namespace kiln::ops {

void register_cuda_fp8_kernels(KernelRegistry& r, const Fp8Ops& ops) {
  const DeviceKind d = DeviceKind::CUDA;
  r.add(ops.quantize, d, cuda::fp8_quantize);
  r.add(ops.quantize_transpose, d, cuda::fp8_quantize_transpose);
  r.add(ops.dequantize, d, cuda::fp8_dequantize);
  r.add(ops.gemm, d, cuda::fp8_gemm);
  r.add(ops.gemm_unsupported, d, cuda::fp8_gemm_unsupported);
  r.add(ops.delayed_scaling_update, d, cuda::fp8_delayed_scaling_update);
  r.add(ops.delayed_scaling_update_many, d, cuda::fp8_delayed_scaling_update_many);
  r.add(ops.piece_amax, d, cuda::fp8_piece_amax);
  r.add(ops.piece_quantize, d, cuda::fp8_piece_quantize);
}

}  // namespace kiln::ops
