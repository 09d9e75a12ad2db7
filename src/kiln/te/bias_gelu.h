#pragma once
// A linear layer with its bias and GELU (tanh) fused into the GEMM: on CUDA one cuBLASLt call
// with the GELU_AUX_BIAS epilogue (the pre-activation is kept as the epilogue's aux output for
// the backward); on the CPU the CPU GEMM and one pass for bias + GELU. For a whole MLP prefer
// linear_gelu_linear (te/gelu_mlp.h), whose backward forms the GELU derivative and the bias
// gradient in one pass right after the second layer's data-gradient GEMM.
#include "kiln/tensor/tensor.h"

namespace kiln::te {

// x [..., K], w [O, K], b [O] or undefined (no bias), one floating dtype and device
// -> gelu_tanh(x w^T + b), [..., O]. Differentiable in x, w and b.
Tensor linear_bias_gelu(const Tensor& x, const Tensor& w, const Tensor& b);

}  // namespace kiln::te
