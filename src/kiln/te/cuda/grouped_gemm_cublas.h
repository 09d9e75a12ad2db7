#pragma once
// The experts' grouped GEMM through cuBLAS, with the per-expert row offsets read back to the host
// first. TransformerEngine's GroupedLinear needs host counts too (its m_splits are host integers, and
// Megatron syncs tokens_per_expert to the host every layer). The read-back synchronises the stream,
// which a CUDA graph capture cannot contain: while the stream is capturing these return false and
// the caller runs the device-offsets kernel (te/cuda/grouped_gemm_tc.cu) instead.
//
// With the counts on the host, the ways to run the experts (KILN_GROUPED_GEMM picks, read on every
// call so that tests and benchmarks can switch it: te/grouped_gemm_path.h):
//   grouped            one cublasGemmGroupedBatchedEx call per product (forward, data gradient,
//                      weight gradient): every expert with rows is one problem, problems of equal
//                      shape one group (te/grouped_gemm_args.h builds the arguments on the host; the
//                      A/B/C pointer arrays, which cuBLAS reads on the device, go there through
//                      te/cuda/device_pointer_table.h). bf16 and f16 with f32 accumulation, f32 in
//                      true FP32 (TF32 with KILN_ALLOW_TF32=1), as cuBLAS documents the call. Other
//                      dtypes, operands not 16-byte aligned per expert, or dimensions past 32 bits
//                      take the loop.
//   loop               one cuBLASLt GEMM per expert with rows (ops::gemm_into).
//   auto (default)     chunked's forward and data gradient when any expert has rows but fewer than
//                      1024 (te/grouped_gemm_path.h), else the loop; the weight gradient then as
//                      grouped, else the loop.
//   chunked            the forward and data gradient as a few pointer-array batched cuBLASLt GEMMs
//                      over blocks of each expert's rows (te/cuda/grouped_gemm_chunked.h), the
//                      weight gradient as the loop; the loop where the batched call does not apply.
//   tc                 these return false: the device-offsets tensor-core kernel always.
// Either way, rows past offsets[E] are zeroed and an expert without rows gets a zero weight gradient.
#include <cstdint>
#include <span>

#include "kiln/te/grouped_gemm_path.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te::cuda {

// How many cublasGemmGroupedBatchedEx calls this process has made (tests check that the grouped
// path ran rather than its loop fallback).
std::int64_t grouped_gemm_grouped_calls();

// y[r] = x[r] w[e]^T (trans_w false, w [E, O, K]) or x[r] w[e] (trans_w true, w [E, K, O]) for the
// rows r of expert e (offsets [E + 1], int64 on the device); rows past offsets[E] are zeroed.
bool grouped_gemm_cublas(const Tensor& x, const Tensor& w, const Tensor& offsets, bool trans_w, const Tensor& y);
// dw[e] = sum over expert e's rows of dy[r]^T x[r]; an expert without rows gets zeros.
bool grouped_gemm_wgrad_cublas(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dw);

// The same with the offsets already on the host (what the two above run after their read-back;
// bench_grouped_gemm times them without it), by `path` (Auto, Grouped, Loop or Chunked; each falls
// back to the per-expert loop where it does not apply, see above).
void grouped_gemm_host_offsets(const Tensor& x, const Tensor& w, std::span<const std::int64_t> offsets, bool trans_w,
                               const Tensor& y, GroupedGemmPath path);
void grouped_gemm_wgrad_host_offsets(const Tensor& dy, const Tensor& x, std::span<const std::int64_t> offsets,
                                     const Tensor& dw, GroupedGemmPath path);

}  // namespace kiln::te::cuda
