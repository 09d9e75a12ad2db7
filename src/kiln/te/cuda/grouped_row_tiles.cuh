#pragma once
// The grouped GEMMs' map from a block to its (expert, row tile) over the expert-major rows, read
// from the per-expert offsets on the device (so nothing waits for the host to learn the counts):
// block b walks the experts' tiles of TileRows rows (each expert's last one partial), then the
// tiles of the unused tail rows offsets[E] .. R (expert -1: the block zeroes them). Used by the
// SIMT kernel (te/cuda/moe.cu) and the tensor-core one (te/cuda/grouped_gemm_tc.cu).
#include <cstdint>

namespace kiln::te::cuda {

// Returns false for a block beyond both the experts' tiles and the tail's.
template <int TileRows>
__device__ __forceinline__ bool tile_of_block(std::int64_t b, const std::int64_t* offsets, std::int64_t e_count,
                                              std::int64_t rows, std::int64_t* expert, std::int64_t* row0,
                                              std::int64_t* row_end) {
  for (std::int64_t e = 0; e < e_count; ++e) {
    const std::int64_t lo = offsets[e], hi = offsets[e + 1], tiles = (hi - lo + TileRows - 1) / TileRows;
    if (b < tiles) {
      *expert = e;
      *row0 = lo + b * TileRows;
      *row_end = hi;
      return true;
    }
    b -= tiles;
  }
  const std::int64_t tail0 = offsets[e_count] + b * TileRows;
  if (tail0 >= rows) return false;
  *expert = -1;
  *row0 = tail0;
  *row_end = rows;
  return true;
}

// Blocks to launch over R rows and E experts: at most ceil(R / TileRows) full tiles, plus one
// partial tile per expert and the tail's first.
inline std::int64_t grouped_row_tile_blocks(std::int64_t rows, std::int64_t e_count, std::int64_t tile_rows) {
  return (rows + tile_rows - 1) / tile_rows + e_count + 1;
}

}  // namespace kiln::te::cuda
