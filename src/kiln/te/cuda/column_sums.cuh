#pragma once
// Column sums of a [rows, cols] matrix in two steps, for weight and bias gradients: blocks of
// rows write float32 partial sums [chunks, cols], then finish_column_sums adds the chunks per
// column (in double) and stores the result in the gradient's dtype. Used by te/cuda/*.cu only.
#include "kiln/ops/cuda/cuda_common.cuh"

namespace kiln::te::cuda {

template <int kUnused = 0>
__global__ void finish_column_sums_kernel(const float* __restrict__ partial, std::int64_t chunks, std::int64_t cols,
                                          ops::cuda::DynPtr out) {
  const std::int64_t j = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  double s = 0;
  for (std::int64_t c = 0; c < chunks; ++c) s += partial[c * cols + j];
  ops::cuda::store_dyn(out.p, out.t, j, s);
}

inline void finish_column_sums(const Tensor& partial, const Tensor& out, cudaStream_t stream) {
  const std::int64_t chunks = partial.shape()[0], cols = partial.shape()[1];
  const int threads = 256;
  const int blocks = static_cast<int>((cols + threads - 1) / threads);
  finish_column_sums_kernel<<<blocks, threads, 0, stream>>>(static_cast<const float*>(partial.data_ptr()), chunks, cols,
                                                            ops::cuda::dyn(out));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::te::cuda
