#include <cstddef>

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

// The panel's interchanges as one permutation (see build_pivot_plan in the header). One block:
// the first occurrence of every pivot row below the panel is found in parallel, then one thread
// replays the jb swaps on "which original row's content sits here" for the top rows and for each
// distinct row below.
__global__ void pivot_plan_kernel(const int* ipiv, long j, int jb, int* plan) {
  extern __shared__ int shared[];
  int* pivot = shared;                   // jb: pivot row of step k
  int* first = shared + jb;              // jb: first step choosing the same row below the panel
  int* top_content = shared + 2 * jb;    // jb: original row whose content sits at top row i
  int* below_content = shared + 3 * jb;  // jb: the same for the row below first chosen at step s
  const long bottom = j + jb;            // rows >= bottom are below the panel's top block
  for (int k = threadIdx.x; k < jb; k += blockDim.x) {
    pivot[k] = ipiv[j + k];
    top_content[k] = static_cast<int>(j + k);
  }
  __syncthreads();
  for (int k = threadIdx.x; k < jb; k += blockDim.x) {
    int f = k;
    if (pivot[k] >= bottom)
      for (int e = 0; e < k; ++e)
        if (pivot[e] == pivot[k]) {
          f = e;
          break;
        }
    first[k] = f;
    below_content[k] = pivot[k];
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int k = 0; k < jb; ++k) {
    const long p = pivot[k];
    if (p == j + k) continue;
    int* other = p < bottom ? &top_content[p - j] : &below_content[first[k]];
    const int t = top_content[k];
    top_content[k] = *other;
    *other = t;
  }
  int* top_source = plan + 1;
  int* below_row = plan + 1 + jb;
  int* below_source = plan + 1 + 2 * jb;
  int count = 0;
  for (int k = 0; k < jb; ++k) {
    top_source[k] = top_content[k];
    if (pivot[k] >= bottom && first[k] == k) {
      below_row[count] = pivot[k];
      below_source[count] = below_content[k];
      ++count;
    }
  }
  plan[0] = count;
}

// Columns [c0, c1): the rows that end up on top go to w (jb x width, leading dimension jb), the
// top rows' old contents go to the rows below that gave up theirs. All reads of a column come
// before its writes, so the permutation is applied at once rather than swap by swap.
constexpr int kSwapThreads = 256;
constexpr int kSwapColumnsPerBlock = 4;

__global__ void swap_gather_kernel(double* a, long lda, long j, int jb, const int* plan, double* w, long c0, long c1) {
  extern __shared__ double column_cache[];
  double* top = column_cache;           // jb: the column's top rows as they were
  double* fetched = column_cache + jb;  // jb: the rows from below that move to the top
  const int below_count = plan[0];
  const int* top_source = plan + 1;
  const int* below_row = plan + 1 + jb;
  const int* below_source = plan + 1 + 2 * jb;
  const long bottom = j + jb;
  const long first = c0 + static_cast<long>(blockIdx.x) * kSwapColumnsPerBlock;
  const long last = first + kSwapColumnsPerBlock < c1 ? first + kSwapColumnsPerBlock : c1;
  for (long c = first; c < last; ++c) {
    double* col = a + c * lda;
    for (int i = threadIdx.x; i < jb; i += blockDim.x) {
      top[i] = col[j + i];
      const int s = top_source[i];
      if (s >= bottom) fetched[i] = col[s];
    }
    __syncthreads();
    double* out = w + (c - c0) * jb;
    for (int i = threadIdx.x; i < jb; i += blockDim.x) {
      const int s = top_source[i];
      out[i] = s >= bottom ? fetched[i] : top[s - j];
    }
    for (int q = threadIdx.x; q < below_count; q += blockDim.x) col[below_row[q]] = top[below_source[q] - j];
    __syncthreads();  // the cache is refilled by the next column
  }
}

__global__ void identity_kernel(double* m, int n) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < static_cast<long>(n) * n) m[i] = (i % (n + 1) == 0) ? 1.0 : 0.0;
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

cudaError_t build_pivot_plan(const int* ipiv, long j, int jb, int* plan, cudaStream_t stream) {
  pivot_plan_kernel<<<1, 1024, sizeof(int) * 4 * static_cast<std::size_t>(jb), stream>>>(ipiv, j, jb, plan);
  return cudaGetLastError();
}

cudaError_t swap_gather(double* a, long lda, long j, int jb, const int* plan, double* w, long c0, long c1,
                        cudaStream_t stream) {
  if (c1 <= c0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((c1 - c0 + kSwapColumnsPerBlock - 1) / kSwapColumnsPerBlock);
  swap_gather_kernel<<<blocks, kSwapThreads, sizeof(double) * 2 * static_cast<std::size_t>(jb), stream>>>(
      a, lda, j, jb, plan, w, c0, c1);
  return cudaGetLastError();
}

cudaError_t set_identity(double* m, int n, cudaStream_t stream) {
  const long count = static_cast<long>(n) * n;
  identity_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(m, n);
  return cudaGetLastError();
}

cudaError_t residual_parts(const double* x, long n, std::uint32_t seed, double* residual, double* row_abs, double* b,
                           cudaStream_t stream) {
  residual_kernel<<<row_column_grid(n), kRowsPerBlock, 0, stream>>>(x, n, seed, hpl_jump(n), residual, row_abs, b);
  return cudaGetLastError();
}

}  // namespace kiln::hpl::cuda
