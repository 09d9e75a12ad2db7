#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/transpose_copy.h"

namespace kiln::ops::cuda {
namespace {

constexpr int kTile = 32;     // a 32 x 32 tile per block
constexpr int kTileRows = 8;  // 256 threads: each moves 4 elements of the tile each way

// One tile at a time, blocks striding over [batch, row tiles, column tiles]. The +1 column of
// padding keeps the column reads of the tile off a single shared-memory bank.
template <class U>
__global__ void __launch_bounds__(kTile* kTileRows)
    batched_transpose_kernel(BatchedTranspose t, std::int64_t row_tiles, std::int64_t col_tiles, const U* src, U* dst) {
  __shared__ U tile[kTile][kTile + 1];
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const std::int64_t per_batch = row_tiles * col_tiles, tiles = t.batch * per_batch;
  for (std::int64_t i = blockIdx.x; i < tiles; i += gridDim.x) {
    const std::int64_t b = i / per_batch, within = i - b * per_batch;
    const std::int64_t r0 = (within / col_tiles) * kTile, c0 = (within % col_tiles) * kTile;
    const U* s = src + b * t.src_batch_stride;
    U* d = dst + b * t.rows * t.cols;
    // Read along r (the source's contiguous direction): tile[k][x] = element (r0 + x, c0 + k).
    const std::int64_t r = r0 + tx;
    for (int k = ty; k < kTile; k += kTileRows) {
      const std::int64_t c = c0 + k;
      if (r < t.rows && c < t.cols) tile[k][tx] = s[r + c * t.src_ld];
    }
    __syncthreads();
    // Write along c (the destination's contiguous direction): element (r0 + k, c0 + x) = tile[x][k].
    const std::int64_t c = c0 + tx;
    for (int k = ty; k < kTile; k += kTileRows) {
      const std::int64_t rr = r0 + k;
      if (rr < t.rows && c < t.cols) d[rr * t.cols + c] = tile[tx][k];
    }
    __syncthreads();  // the next tile overwrites this one
  }
}

template <class U>
void launch(const BatchedTranspose& t, const void* src, void* dst, cudaStream_t stream, int device_index) {
  const std::int64_t row_tiles = (t.rows + kTile - 1) / kTile, col_tiles = (t.cols + kTile - 1) / kTile;
  const int threads = kTile * kTileRows;
  // One block a tile, capped at a few waves (the blocks stride over the rest).
  const int grid = grid_for(t.batch * row_tiles * col_tiles * threads, threads, device_index);
  batched_transpose_kernel<U>
      <<<grid, threads, 0, stream>>>(t, row_tiles, col_tiles, static_cast<const U*>(src), static_cast<U*>(dst));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_batched_transpose(const BatchedTranspose& t, int element_bytes, const void* src, void* dst,
                              cudaStream_t stream, int device_index) {
  switch (element_bytes) {
    case 1: return launch<std::uint8_t>(t, src, dst, stream, device_index);
    case 2: return launch<std::uint16_t>(t, src, dst, stream, device_index);
    case 4: return launch<std::uint32_t>(t, src, dst, stream, device_index);
    case 8: return launch<std::uint64_t>(t, src, dst, stream, device_index);
    default: KILN_FAIL("batched transpose: elements of {} bytes are not supported", element_bytes);
  }
}

}  // namespace kiln::ops::cuda
