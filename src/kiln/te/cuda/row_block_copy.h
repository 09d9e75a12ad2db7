#pragma once
// Copies blocks of rows between two row-major matrices of one width on the device: job i copies
// rows[i] rows of `cols` elements from src[i] to dst[i] (rows contiguous, row stride `cols`).
// The chunked grouped GEMM (te/cuda/grouped_gemm_chunked.cpp) moves each expert's last, partial
// block of rows from the padded scratch its batched GEMM wrote to the expert's rows of the output.
// Jobs travel as kernel parameters (as device_pointer_table.h's pointers do): no staging buffer.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/runtime/vendor/cuda.h"

namespace kiln::te::cuda {

struct RowBlockCopy {
  const void* src;
  void* dst;
  std::int64_t rows;
};

// element_size: 2 (bf16, f16) or 4 (f32); cols * element_size must be a multiple of 4.
void copy_row_blocks(const std::vector<RowBlockCopy>& jobs, std::int64_t cols, std::size_t element_size,
                     cudaStream_t stream);

}  // namespace kiln::te::cuda
