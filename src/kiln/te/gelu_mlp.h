#pragma once
// GPT-2's MLP, fc2(gelu_tanh(fc1(x))): the fc1 GEMM applies bias + GELU and keeps the
// pre-activation (cuBLASLt's GELU_AUX_BIAS epilogue), and in the backward the fc2 data-gradient GEMM
// is followed by one pass that applies the GELU derivative and reduces fc1's bias gradient (cuBLASLt's
// DGELU_BGRAD epilogue ran as a separate, slower kernel on the H200: te/cuda/bias_gelu.cu). On the
// CPU the same computation with the CPU GEMM and one pass per epilogue.
#include "kiln/tensor/tensor.h"

namespace kiln::te {

// x [..., K], w1 [F, K], b1 [F] or undefined, w2 [H, F], b2 [H] or undefined, one floating dtype
// and device -> gelu_tanh(x w1^T + b1) w2^T + b2, [..., H]. Differentiable in all five.
Tensor linear_gelu_linear(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2);

}  // namespace kiln::te
