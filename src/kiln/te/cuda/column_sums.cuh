#pragma once
// Column sums of a [rows, cols] matrix in two steps, for weight and bias gradients: blocks of
// rows write float32 partial sums [chunks, cols], then finish_column_sums adds the chunks per
// column (in double) and stores the result in the gradient's dtype. Used by te/cuda/*.cu only.
#include "kiln/ops/cuda/cuda_common.cuh"

namespace kiln::te::cuda {

// One block per 32 columns: 32 lanes read 32 adjacent columns of a partial row (coalesced), 32
// warps stride over the chunks, and the warps' sums meet in shared memory in a fixed order (the
// result does not depend on timing). A norm's backward has a few thousand chunks: one thread per
// column walking them all (the first version) took 0.33 ms a call on an H200 for 768 columns.
template <int kUnused = 0>
__global__ void __launch_bounds__(1024)
    finish_column_sums_kernel(const float* __restrict__ partial, std::int64_t chunks, std::int64_t cols,
                              ops::cuda::DynPtr out) {
  const std::int64_t j = std::int64_t{blockIdx.x} * 32 + threadIdx.x;
  double s = 0;
  if (j < cols) {
#pragma unroll 8
    for (std::int64_t c = threadIdx.y; c < chunks; c += 32) s += partial[c * cols + j];
  }
  __shared__ double sums[32][33];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
  double t = 0;
  for (int w = 0; w < 32; ++w) t += sums[w][threadIdx.x];
  ops::cuda::store_dyn(out.p, out.t, j, t);
}

inline void finish_column_sums(const Tensor& partial, const Tensor& out, cudaStream_t stream) {
  const std::int64_t chunks = partial.shape()[0], cols = partial.shape()[1];
  const dim3 block(32, 32);
  const auto blocks = static_cast<unsigned>((cols + 31) / 32);
  finish_column_sums_kernel<<<blocks, block, 0, stream>>>(static_cast<const float*>(partial.data_ptr()), chunks, cols,
                                                          ops::cuda::dyn(out));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::te::cuda
