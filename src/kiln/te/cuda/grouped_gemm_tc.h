#pragma once
// The experts' grouped GEMM on tensor cores (bf16 / f16 in, f32 accumulation), one launch over all
// experts: the contracts are te/moe_ops.h's GroupedGemmKernel / GroupedGemmWgradKernel, which
// te/cuda/moe.cu's kernels hand over to these when the operands qualify.
#include "kiln/tensor/tensor.h"

namespace kiln::te::cuda {

// True when a, b and c are all bf16 or all f16, each row (last dim) a whole number of 16-byte
// chunks (a multiple of 8 elements) and each base 16-byte aligned: what cp.async's 16-byte copies
// and the vector stores need.
bool grouped_gemm_tc_supported(const Tensor& a, const Tensor& b, const Tensor& c);
// y[r] = w[e] x[r] (trans_w false, w [E, O, K]) or w[e]^T x[r] (trans_w true, w [E, K, O]).
void grouped_gemm_tc(const Tensor& x, const Tensor& w, const Tensor& offsets, bool trans_w, const Tensor& y);
// dw[e] = sum over expert e's rows of dy[r] x[r]^T.
void grouped_gemm_wgrad_tc(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dw);

}  // namespace kiln::te::cuda
