#pragma once
// HPL on one CUDA GPU (built only with KILN_CUDA; no CUDA types here, so host code can call it).
#include <cstddef>
#include <vector>

#include "kiln/hpc/hpl/hpl_params.h"
#include "kiln/hpc/hpl/run_result.h"

namespace kiln::hpl {

// The largest NB the GPU solver takes (its pivot plan keeps NB rows' indices in shared memory).
inline constexpr long kCudaMaxNb = 2048;

RunResult solve_on_cuda(const RunConfig& run, int device_index);
// Device bytes a run needs: [A|b] plus the small work buffers.
std::size_t cuda_bytes(const RunConfig& run);
double cuda_peer_dgemm_tflops(long n, int device_index, int repeats);
// DGEMM (n-nb) x (n-nb) x nb with beta = 1 inside an n x n matrix: HPL's largest update at NB.
double cuda_peer_update_tflops(long n, long nb, int device_index, int repeats);
double cuda_peer_getrf_tflops(long n, int device_index, int repeats);
// cublasDgemm, then each cuBLASLt candidate, on the update above.
std::vector<PeerAlgo> cuda_peer_update_algos(long n, long nb, int count, int device_index, int repeats);

}  // namespace kiln::hpl
