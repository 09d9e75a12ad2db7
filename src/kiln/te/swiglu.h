#pragma once
// SwiGLU on Megatron's fc1 layout: the last dimension of x is [gate | up], each F wide.
#include "kiln/tensor/fp8_tensor.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te {

// x [..., 2F] (floating; bf16/f16/f32 on CUDA) -> silu(x[..., :F]) * x[..., F:], [..., F].
// Differentiable in x.
Tensor swiglu(const Tensor& x);

// The FP8-output form, for a SwiGLU whose only consumer is an FP8 linear (fc2): the output is
// written as its FP8 cast into out8 (per tensor, [rows, F], out8.scale set: the linear's delayed
// input scale), with out8.amax and out8.scale_inv, in one kernel; the bytes are those of
// fp8_quantize_into(swiglu(x)). The returned tensor has the output's shape, dtype and autograd
// edge but is NOT written: pass it to te::fp8_linear together with out8, nowhere else.
Tensor swiglu_fp8(const Tensor& x, const Fp8Tensor& out8);

}  // namespace kiln::te
