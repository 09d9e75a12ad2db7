#pragma once
// Declarations of the CUDA FP8 kernels (fp8_cast.cu, fp8_gemm.cpp, fp8_block_gemm.cu); fp8_register.cpp registers
// them in the kernel registry. Signatures are those of ops::fp8_sig (fp8_kernels.h).
#include <string>

#include "kiln/ops/fp8_kernels.h"

namespace kiln::ops::cuda {

// fp8_cast.cu
void fp8_quantize(const Tensor& x, const Fp8Tensor& dst, const Fp8CastOptions& options);
void fp8_quantize_transpose(const Tensor& x, const Fp8Tensor& rowwise, const Fp8Tensor& columnwise,
                            const Fp8CastOptions& options);
void fp8_dequantize(const Fp8Tensor& q, const Tensor& out);
// A shard's amaxes and cast (fp8.h's Fp8MatrixPiece), for the optimizer's master -> FP8 weight cast.
void fp8_piece_amax(const Tensor& x, const Fp8MatrixPiece& piece, const Tensor& amax);
void fp8_piece_quantize(const Tensor& x, const Fp8MatrixPiece& piece, const Tensor& scale, const Tensor& dst);
// scale_inv[0] = 1 / scale[0] on the device (after a GEMM with fp8 output).
void fp8_reciprocal(const Tensor& scale, const Tensor& scale_inv);
// One step of TE's DelayedScaling on the device (fp8_delayed_scaling.cu).
void fp8_delayed_scaling_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inv, bool most_recent,
                                float scaled_max);
// Many tensors' updates, one thread each, in one launch (per 32 tensors).
void fp8_delayed_scaling_update_many(const std::vector<Fp8DelayedScalingRef>& states, bool most_recent);
// fp8_gemm.cpp
void fp8_gemm(const Fp8GemmArgs& args);
std::string fp8_gemm_unsupported(const Fp8GemmArgs& args);
// fp8_block_gemm.cu: Kiln's own block-scaled GEMM (any pair of 1x128 / 128x128 operands, bf16 / f32
// output, optional bias); fp8_gemm runs it where cuBLASLt cannot. Declared here for the tests too.
void fp8_block_gemm_kiln(const Fp8GemmArgs& args);

}  // namespace kiln::ops::cuda
