#pragma once
// SwiGLU on Megatron's fc1 layout: the last dimension of x is [gate | up], each F wide.
#include "kiln/tensor/tensor.h"

namespace kiln::te {

// x [..., 2F] (floating; bf16/f16/f32 on CUDA) -> silu(x[..., :F]) * x[..., F:], [..., F].
// Differentiable in x.
Tensor swiglu(const Tensor& x);

}  // namespace kiln::te
