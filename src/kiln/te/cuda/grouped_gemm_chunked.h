#pragma once
// The experts' forward and data-gradient products (y[r] = x[r] w[e]^T, or x[r] w[e] with trans_w)
// in a handful of cuBLASLt launches whatever the number of experts: each expert's rows are cut into
// blocks of kLargeChunkRows, then of kChunkRows, and all the experts' blocks of one size run as one
// pointer-array batched GEMM (every problem the same shape: rows x O x K, its own A, B and C
// addresses; the large blocks keep big experts on cuBLAS's large tiles); each expert's
// last, partial block is padded to a multiple of kRemainderStep rows and runs, by padded size, in at
// most kChunkRows / kRemainderStep more batched GEMMs into a scratch buffer, from which one copy
// kernel moves the real rows into y. A partial block whose padding would read past x's last row
// runs alone on its exact rows. The loop of one GEMM per expert (te/cuda/grouped_gemm_cublas.h)
// is launch-bound when there are many small experts (128 experts of ~500 rows: ~10 us of host time
// per GEMM against ~3 us of GPU work); this is the same cuBLAS kernels' work in ~6 launches.
// The padding costs at most kRemainderStep - 1 rows of work per expert.
#include <cstdint>
#include <span>

#include "kiln/tensor/tensor.h"

namespace kiln::te::cuda {

inline constexpr std::int64_t kLargeChunkRows = 1024;
inline constexpr std::int64_t kChunkRows = 128;
inline constexpr std::int64_t kRemainderStep = 32;

// x [R, K], w [E, O, K] (or [E, K, O] with trans_w), y [R, O], all contiguous CUDA tensors of one
// dtype (bf16, f16, f32); offsets [E + 1] on the host. Writes y's rows below offsets[E] (the caller
// zeroes the rest). False, having done nothing, where it does not apply: another dtype, or an
// operand address not 16-byte aligned.
bool grouped_gemm_chunked(const Tensor& x, const Tensor& w, std::span<const std::int64_t> offsets, bool trans_w,
                          const Tensor& y);

}  // namespace kiln::te::cuda
