#pragma once
// A copy that is a (batched) 2-D transpose, through shared-memory tiles: both the reads and the
// writes are coalesced. The general strided copy reads a transposed source one element per thread
// down a column, so every warp touches 32 rows: for 1-byte FP8 data (the columnwise operand of a
// producer-cast activation, x^T) that ran at a fraction of the bandwidth.
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::ops::cuda {

// dst[b][r][c], contiguous [batch, rows, cols], = src[b * src_batch_stride + r + c * src_ld]: the
// source is contiguous along r (its columns are dst's rows).
struct BatchedTranspose {
  std::int64_t batch = 1, rows = 0, cols = 0;
  std::int64_t src_ld = 0, src_batch_stride = 0;
};

// `element_bytes` is 1, 2, 4 or 8 (the raw bits move; no conversion).
void launch_batched_transpose(const BatchedTranspose& t, int element_bytes, const void* src, void* dst,
                              cudaStream_t stream, int device_index);

}  // namespace kiln::ops::cuda
