#pragma once
// One kernel for a leaf of HPL's recursive panel factorisation on the GPU: columns [k0, k0+w) of
// the panel (w <= kMaxLeafWidth), every column pivoted, swapped across the whole panel width,
// scaled and pushed right-looking into the rest of the leaf. Each block keeps its rows of the leaf
// in shared memory when they fit, so a column costs one barrier and no global traffic.
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

// The most blocks a leaf launch uses on `device`: one per SM.
int leaf_max_blocks(int device);

// Shared memory a block may give to its rows of the leaf on `device` (bytes).
std::size_t leaf_tile_capacity(int device);

// Factors leaf columns [k0, k0+w) of the panel whose top-left entry is `panel` (the matrix at
// (j, j), stored by rows: entry (r, c) at panel[r * ld + c]; m rows, jb columns). Records
// ipiv[j + k] (global rows) as HPL does. `blocks` <= leaf_max_blocks(). When a block's rows of the
// leaf fit in `tile_bytes` of shared memory they are kept there for the whole leaf (read and
// written once); otherwise every column reads and writes them in the matrix. The interchanges
// across the panel's other columns are shared by the first `swap_blocks` blocks (0 or more than
// `blocks`: all of them).
cudaError_t factor_leaf(double* panel, long ld, long m, int jb, int k0, int w, long j, int* ipiv, double* scratch,
                        int blocks, cudaStream_t stream, std::size_t tile_bytes, int swap_blocks = 0);

}  // namespace kiln::hpl::cuda
