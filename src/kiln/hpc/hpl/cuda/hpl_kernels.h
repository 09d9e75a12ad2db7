#pragma once
// The few kernels HPL needs besides cuBLAS: matrix generation, the pivot swap inside a panel, the
// panel's row interchanges as one permutation applied to the trailing columns, and the fused
// residual (A regenerated on the fly).
//
// Each launcher returns the launch's error for the caller to check with KILN_CUDA_CHECK. This
// header names cudaStream_t/cudaError_t but includes nothing: host files include
// kiln/runtime/vendor/cuda.h first, and nvcc provides the runtime to hpl_kernels.cu itself, which
// so stays free of fmt (fmt 9's constexpr checks do not compile under nvcc in C++20 mode).
#include <cstdint>

namespace kiln::hpl::cuda {

// Fills the n x (n+1) column-major [A|b] (leading dimension lda) with HPL's sequence for `seed`
// (the peers' matrices).
cudaError_t generate_matrix(double* a, long lda, long n, std::uint32_t seed, cudaStream_t stream);

// The solver stores [A|b] by rows: entry (i, c) at a[i * ld + c] (ld >= n + 1), which is the
// column-major storage of its transpose. A row interchange is then two contiguous rows, not one
// 8-byte entry per column in its own 32-byte sector. Same numbers as generate_matrix; the entries
// of columns n+1 .. ld-1 (padding) are set to zero.
cudaError_t generate_matrix_rows(double* a, long ld, long n, std::uint32_t seed, cudaStream_t stream);

// Panel column k (panel = the row-stored matrix at (j, j)): `amax_index` holds cuBLAS's 1-based
// Idamax over rows k.. of column k. Records the global pivot row in ipiv[j + k], swaps panel rows
// k and the pivot across the panel's jb columns, and stores 1/pivot in *inverse_pivot.
cudaError_t swap_pivot_row(double* panel, long ld, int jb, int k, long j, const int* amax_index, int* ipiv,
                           double* inverse_pivot, cudaStream_t stream);

// The interchanges ipiv[j .. j+jb) of one panel (global rows, applied in order) as a single
// permutation, in `plan` (1 + 3 jb ints): plan[0] = q, the number of rows below the panel's top
// block that change; then top_source[jb] (the original row whose content ends up in row j+i), then
// below_row[q] and below_source[q] (row below_row[k] receives the content of top row
// below_source[k]; it is always a top row's). jb <= kMaxPlanWidth.
inline constexpr int kMaxPlanWidth = 2048;
cudaError_t build_pivot_plan(const int* ipiv, long j, int jb, int* plan, cudaStream_t stream);

// Applies a plan to columns [c0, c1) of the row-stored matrix: the new top row j+i is written to
// W instead of the matrix (entry c at w[i * ldw + c - c0], so W holds just these columns, ldw >=
// c1 - c0), the displaced rows below are written in place.
cudaError_t swap_gather(double* a, long ld, int jb, const int* plan, double* w, long ldw, long c0, long c1,
                        cudaStream_t stream);

// The n x n identity (leading dimension n).
cudaError_t set_identity(double* m, int n, cudaStream_t stream);

// residual[i] = (A x)_i - b_i, row_abs[i] = sum_j |A_ij|, b[i] = b_i, with A and b generated again
// from the seed (the device copy was overwritten by the factors). residual and row_abs must be
// zero on entry (they are accumulated over column chunks).
cudaError_t residual_parts(const double* x, long n, std::uint32_t seed, double* residual, double* row_abs, double* b,
                           cudaStream_t stream);

}  // namespace kiln::hpl::cuda
