#pragma once
// Which way the CUDA grouped GEMM of the experts runs (te/cuda/grouped_gemm_cublas.h), from the
// environment variable KILN_GROUPED_GEMM, read on every call so that tests and benchmarks can switch
// it: unset or empty = Loop (one cuBLASLt GEMM per expert: the path measured on the H200), "grouped"
// (one cublasGemmGroupedBatchedEx call per product), "loop", "tc" (Kiln's device-offsets
// tensor-core kernel). Any other value is a kiln::Error naming the variable and the values it
// takes. Here, apart from the CUDA code, so that the CPU tests check the parsing.
namespace kiln::te {

enum class GroupedGemmPath { Grouped, Loop, Tc };

GroupedGemmPath grouped_gemm_path();

}  // namespace kiln::te
