#pragma once
// The experts' grouped GEMM as one cuBLAS(Lt) GEMM per expert, with the per-expert row offsets read
// back to the host first. TransformerEngine's GroupedLinear does the same (its m_splits are host
// integers, and Megatron syncs tokens_per_expert to the host every layer): on the H200 the loop of
// cuBLAS GEMMs ran 2.3-3.4x the tensor-core kernel of te/cuda/grouped_gemm_tc.cu (bench_grouped_gemm,
// 2026-12-03, timed before the kernel's staging fix, which moves where copies land, not how many),
// far more than the read-back costs. The read-back synchronises the stream, which a CUDA
// graph capture cannot contain: while the stream is capturing these return false and the caller runs
// the device-offsets kernel instead. KILN_GROUPED_GEMM=tc forces that kernel always (for benchmarks).
#include "kiln/tensor/tensor.h"

namespace kiln::te::cuda {

// y[r] = x[r] w[e]^T (trans_w false, w [E, O, K]) or x[r] w[e] (trans_w true, w [E, K, O]) for the
// rows r of expert e (offsets [E + 1], int64 on the device); rows past offsets[E] are zeroed.
bool grouped_gemm_cublas(const Tensor& x, const Tensor& w, const Tensor& offsets, bool trans_w, const Tensor& y);
// dw[e] = sum over expert e's rows of dy[r]^T x[r]; an expert without rows gets zeros.
bool grouped_gemm_wgrad_cublas(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dw);

}  // namespace kiln::te::cuda
