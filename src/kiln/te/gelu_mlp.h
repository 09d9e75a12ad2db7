#pragma once
// GPT-2's MLP, fc2(gelu_tanh(fc1(x))), with both cuBLASLt epilogues TransformerEngine uses: the fc1
// GEMM applies bias + GELU and keeps the pre-activation (GELU_AUX_BIAS), and in the backward the
// fc2 data-gradient GEMM applies the GELU derivative and reduces fc1's bias gradient (DGELU_BGRAD),
// so no separate pass over the [N, F] activations runs for either. On the CPU the same
// computation with the CPU GEMM and one pass per epilogue.
#include "kiln/tensor/tensor.h"

namespace kiln::te {

// x [..., K], w1 [F, K], b1 [F] or undefined, w2 [H, F], b2 [H] or undefined, one floating dtype
// and device -> gelu_tanh(x w1^T + b1) w2^T + b2, [..., H]. Differentiable in all five.
Tensor linear_gelu_linear(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2);

}  // namespace kiln::te
