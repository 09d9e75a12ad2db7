#pragma once
// Raw matrix products. gemm works on 3-D (batch, rows, cols) contiguous tensors.
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

// out = op(a) @ op(b), batched over dim 0; a/b/out contiguous 3-D. Returns a new tensor.
Tensor gemm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);
// out = alpha op(a) @ op(b) + beta out into an existing tensor (beta 1 accumulates). out has a's
// dtype, or is float32 for bf16/f16 operands: the product then stays in the GEMM's fp32
// accumulator precision (a 16-bit weight's gradient added into its fp32 main gradient).
void gemm_into(const Tensor& a, const Tensor& b, const Tensor& out, bool trans_a, bool trans_b, double alpha,
               double beta);
// op(a) @ op(b) + bias, bias [n] (same dtype and device) added to every row; a/b contiguous 3-D.
Tensor gemm_bias(const Tensor& a, const Tensor& b, const Tensor& bias, bool trans_a, bool trans_b);

}  // namespace kiln::ops
