#include "kiln/hpc/hpl/cuda/hpl_kernels.h"
#include "kiln/hpc/hpl/hpl_random.h"

namespace kiln::hpl::cuda {

namespace {

constexpr int kRowsPerBlock = 256;
// Each thread walks one row across this many columns: the generator steps by n numbers per column
// (one multiply-add), so only the first entry of a run needs a jump.
constexpr long kColumnsPerThread = 256;

__global__ void generate_kernel(double* a, long lda, long n, std::uint32_t seed, AffineStep column_step) {
  const long i = static_cast<long>(blockIdx.x) * kRowsPerBlock + threadIdx.x;
  const long c0 = static_cast<long>(blockIdx.y) * kColumnsPerThread;
  if (i >= n) return;
  const long c1 = c0 + kColumnsPerThread < n + 1 ? c0 + kColumnsPerThread : n + 1;
  std::uint64_t x = hpl_state_at(seed, n, i, c0);
  for (long c = c0; c < c1; ++c) {
    a[c * lda + i] = hpl_value(x);  // consecutive threads write consecutive rows: coalesced
    x = column_step.apply(x);
  }
}

__global__ void swap_pivot_kernel(double* panel, long lda, int jb, int k, long j, const int* amax_index, int* ipiv,
                                  double* inverse_pivot) {
  const long p = k + amax_index[0] - 1;  // cuBLAS indices are 1-based
  if (threadIdx.x == 0) {
    ipiv[j + k] = static_cast<int>(j + p);
    *inverse_pivot = 1.0 / panel[k * lda + p];
  }
  if (p == k) return;
  __syncthreads();  // the pivot is read before the thread owning column k moves it
  for (int c = threadIdx.x; c < jb; c += blockDim.x) {
    double t = panel[c * lda + k];
    panel[c * lda + k] = panel[c * lda + p];
    panel[c * lda + p] = t;
  }
}

// One thread per column; the interchanges are applied in order (they do not commute).
__global__ void row_swaps_kernel(double* a, long lda, long j, int jb, const int* ipiv, long c0, long c1) {
  extern __shared__ int pivots[];
  for (int k = threadIdx.x; k < jb; k += blockDim.x) pivots[k] = ipiv[j + k];
  __syncthreads();
  const long c = c0 + static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= c1) return;
  double* col = a + c * lda;
  for (int k = 0; k < jb; ++k) {
    const long g = j + k, p = pivots[k];
    if (p != g) {
      double t = col[g];
      col[g] = col[p];
      col[p] = t;
    }
  }
}

__global__ void residual_kernel(const double* x, long n, std::uint32_t seed, AffineStep column_step, double* residual,
                                double* row_abs, double* b) {
  const long i = static_cast<long>(blockIdx.x) * kRowsPerBlock + threadIdx.x;
  const long c0 = static_cast<long>(blockIdx.y) * kColumnsPerThread;
  if (i >= n) return;
  const long c1 = c0 + kColumnsPerThread < n + 1 ? c0 + kColumnsPerThread : n + 1;
  std::uint64_t s = hpl_state_at(seed, n, i, c0);
  double sum = 0, abs_sum = 0;
  for (long c = c0; c < c1; ++c) {
    const double v = hpl_value(s);
    if (c < n) {
      sum += v * x[c];
      abs_sum += fabs(v);
    } else {
      sum -= v;
      b[i] = v;
    }
    s = column_step.apply(s);
  }
  atomicAdd(residual + i, sum);
  atomicAdd(row_abs + i, abs_sum);
}

dim3 row_column_grid(long n) {
  return dim3(static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock),
              static_cast<unsigned>((n + 1 + kColumnsPerThread - 1) / kColumnsPerThread));
}

}  // namespace

cudaError_t generate_matrix(double* a, long lda, long n, std::uint32_t seed, cudaStream_t stream) {
  generate_kernel<<<row_column_grid(n), kRowsPerBlock, 0, stream>>>(a, lda, n, seed, hpl_jump(n));
  return cudaGetLastError();
}

cudaError_t swap_pivot_row(double* panel, long lda, int jb, int k, long j, const int* amax_index, int* ipiv,
                           double* inverse_pivot, cudaStream_t stream) {
  swap_pivot_kernel<<<1, 256, 0, stream>>>(panel, lda, jb, k, j, amax_index, ipiv, inverse_pivot);
  return cudaGetLastError();
}

cudaError_t apply_row_swaps(double* a, long lda, long j, int jb, const int* ipiv, long c0, long c1,
                            cudaStream_t stream) {
  if (c1 <= c0) return cudaSuccess;
  constexpr int threads = 128;
  unsigned blocks = static_cast<unsigned>((c1 - c0 + threads - 1) / threads);
  row_swaps_kernel<<<blocks, threads, sizeof(int) * jb, stream>>>(a, lda, j, jb, ipiv, c0, c1);
  return cudaGetLastError();
}

cudaError_t residual_parts(const double* x, long n, std::uint32_t seed, double* residual, double* row_abs, double* b,
                           cudaStream_t stream) {
  residual_kernel<<<row_column_grid(n), kRowsPerBlock, 0, stream>>>(x, n, seed, hpl_jump(n), residual, row_abs, b);
  return cudaGetLastError();
}

}  // namespace kiln::hpl::cuda
