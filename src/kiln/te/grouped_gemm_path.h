#pragma once
// Which way the CUDA grouped GEMM of the experts runs (te/cuda/grouped_gemm_cublas.h), from the
// environment variable KILN_GROUPED_GEMM, read on every call so that tests and benchmarks can switch
// it: unset or empty = Auto (the default since 2026-12-04: 98 against 114 ms a step for Loop in a
// 128-expert training run, docs/PERF.md), "auto" (per call: Chunked's forward and data gradient when any expert
// has rows but fewer than kAutoChunkedRows, else Loop; the weight gradient then as Grouped, else Loop),
// "grouped" (one cublasGemmGroupedBatchedEx call per product), "loop" (one cuBLASLt GEMM per
// expert), "chunked" (the forward and data gradient as a few pointer-array batched cuBLASLt GEMMs
// over blocks of rows: te/cuda/grouped_gemm_chunked.h; the weight gradient as the loop), "tc"
// (Kiln's device-offsets tensor-core kernel). Any other value is a kiln::Error naming the variable
// and the values it takes. Here, apart from the CUDA code, so that the CPU tests check the parsing.
#include <cstdint>
#include <span>

namespace kiln::te {

enum class GroupedGemmPath { Auto, Grouped, Loop, Chunked, Tc };

GroupedGemmPath grouped_gemm_path();

// Auto's threshold, from bench_grouped_gemm on the H200 (docs/PERF.md, 2026-12-04): with 512-768
// rows per expert the chunked launches beat the loop by 1.1-2.6x; with ~2048 (Mixtral's 8 experts)
// the loop's one large GEMM per expert is as fast.
inline constexpr std::int64_t kAutoChunkedRows = 1024;

// What Auto runs for the forward and data gradient with these offsets [E + 1] (Chunked or Loop);
// other paths are returned as they are.
GroupedGemmPath resolve_grouped_gemm_path(GroupedGemmPath path, std::span<const std::int64_t> offsets);

}  // namespace kiln::te
