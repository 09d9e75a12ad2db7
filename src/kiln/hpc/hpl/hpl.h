#pragma once
// kiln's HPL: the netlib HPL 2.3 algorithm and report, on CPUs (OpenBLAS, any P x Q MPI grid) or
// one CUDA GPU (cuBLAS on FP64 tensor cores, panel factorised on its own stream).
#include <cstdio>
#include <vector>

#include "kiln/hpc/hpl/hpl_params.h"
#include "kiln/hpc/hpl/run_result.h"
#include "kiln/runtime/device.h"

namespace kiln::hpl {

struct SuiteSummary {
  int passed = 0;
  int failed = 0;
};

// Checks every run before any starts (grid against the process count, memory against what the
// device or node has) and throws naming the numbers; then runs every combination of `params`
// and writes HPL's report to `out` on world rank 0. Collective over MPI_COMM_WORLD. Every write
// to `out` is flushed and checked (the header before the first run): a failed write throws on
// every process, naming the output (HPL.dat's device out and file name). The caller closes `out`
// and must check that too.
SuiteSummary run_suite(const Parameters& params, Device device, std::FILE* out);

// Throws if `run` cannot run here: too few processes for its grid, or too little memory.
void validate_run(const RunConfig& run, Device device);

// The peers the GPU result is compared with, on the same device in the same process: cuBLAS
// DGEMM of n x n x n and cuSOLVER getrf of order n, TFLOP/s as a median of `repeats` timed runs
// after one warm-up. Throws in builds without CUDA.
double peer_dgemm_tflops(long n, int device_index, int repeats);
double peer_getrf_tflops(long n, int device_index, int repeats);
// HPL's first trailing update at N and NB alone: DGEMM (n-nb) x (n-nb) x nb, beta = 1.
double peer_update_tflops(long n, long nb, int device_index, int repeats);
// The same update through each of cuBLASLt's heuristic candidates (up to `count`), cublasDgemm
// first: which kernel configuration sustains the highest rate on this shape and this GPU.
std::vector<PeerAlgo> peer_update_algos(long n, long nb, int count, int device_index, int repeats);

}  // namespace kiln::hpl
