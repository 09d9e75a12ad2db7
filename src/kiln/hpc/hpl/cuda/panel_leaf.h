#pragma once
// One kernel for a leaf of HPL's recursive panel factorisation on the GPU: columns [k0, k0+w) of
// the panel (w <= kMaxLeafWidth), every column pivoted, swapped across the whole panel width,
// scaled and pushed right-looking into the rest of the leaf.
//
// Why: done column by column through cuBLAS, a leaf is four to five dependent kernels per column.
// While the trailing update's DGEMM fills every SM, each of them waits for a DGEMM block to retire
// before it can start, which made a 256-wide panel cost ~16 ms at N=120000 however little work it
// held. This kernel is launched cooperatively once per leaf; its blocks stay resident and meet at
// one grid-wide barrier per column.
//
// Like hpl_kernels.h, this header names CUDA types but includes nothing (see there).
#include <cstddef>

namespace kiln::hpl::cuda {

inline constexpr int kMaxLeafWidth = 64;

// Scratch the kernel needs for `blocks` blocks (device memory, no initial contents required).
std::size_t leaf_scratch_doubles(int blocks);

// The most blocks a cooperative leaf launch may use on `device` (all must be resident at once).
int leaf_max_blocks(int device);

// Factors leaf columns [k0, k0+w) of the panel whose top-left entry is `panel` (the matrix at
// (j, j); m rows, jb columns, leading dimension lda). Records ipiv[j + k] (global rows) as HPL
// does. `blocks` <= leaf_max_blocks().
cudaError_t factor_leaf(double* panel, long lda, long m, int jb, int k0, int w, long j, int* ipiv, double* scratch,
                        int blocks, cudaStream_t stream);

}  // namespace kiln::hpl::cuda
