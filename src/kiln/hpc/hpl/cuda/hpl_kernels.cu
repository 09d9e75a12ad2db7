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
// top rows' old contents go to the rows below that gave up theirs. Two kernels, so that every read
// of the first (the gather) comes before any write of the second (the scatter): the permutation is
// applied at once rather than swap by swap, and neither kernel needs a barrier or shared memory.
//
// Both are bound by memory latency, not bandwidth: a row below the panel is one 8-byte entry per
// column, each in its own 32-byte sector. So each thread owns one row of the plan and walks
// kSwapColumns columns with all its loads issued before its stores, which keeps many independent
// loads in flight per thread (the earlier one-column-at-a-time kernel reached ~0.9 TB/s).
constexpr int kSwapThreads = 256;
constexpr int kSwapColumns = 8;

__global__ void gather_top_kernel(const double* a, long lda, int jb, const int* plan, double* w, long c0, long c1) {
  const int i = static_cast<int>(blockIdx.x) * kSwapThreads + static_cast<int>(threadIdx.x);
  if (i >= jb) return;
  const long source = plan[1 + i];  // top_source[i]: a top row or a row below
  const long first = c0 + static_cast<long>(blockIdx.y) * kSwapColumns;
  const double* in = a + first * lda + source;
  double* out = w + (first - c0) * jb + i;
  if (first + kSwapColumns <= c1) {
    double v[kSwapColumns];
#pragma unroll
    for (int c = 0; c < kSwapColumns; ++c) v[c] = __ldg(in + c * lda);
#pragma unroll
    for (int c = 0; c < kSwapColumns; ++c) out[static_cast<long>(c) * jb] = v[c];
  } else {
    for (long c = 0; first + c < c1; ++c) out[c * jb] = in[c * lda];
  }
}

__global__ void scatter_below_kernel(double* a, long lda, int jb, const int* plan, long c0, long c1) {
  const int q = static_cast<int>(blockIdx.x) * kSwapThreads + static_cast<int>(threadIdx.x);
  if (q >= plan[0]) return;
  const long row = plan[1 + jb + q];         // below_row[q]
  const long source = plan[1 + 2 * jb + q];  // below_source[q]: a top row, which no kernel here writes
  const long first = c0 + static_cast<long>(blockIdx.y) * kSwapColumns;
  double* col = a + first * lda;
  if (first + kSwapColumns <= c1) {
    double v[kSwapColumns];
#pragma unroll
    for (int c = 0; c < kSwapColumns; ++c) v[c] = col[c * lda + source];
#pragma unroll
    for (int c = 0; c < kSwapColumns; ++c) col[c * lda + row] = v[c];
  } else {
    for (long c = 0; first + c < c1; ++c) col[c * lda + row] = col[c * lda + source];
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
  (void)j;  // the plan holds global rows
  if (c1 <= c0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((jb + kSwapThreads - 1) / kSwapThreads),
                  static_cast<unsigned>((c1 - c0 + kSwapColumns - 1) / kSwapColumns));
  gather_top_kernel<<<grid, kSwapThreads, 0, stream>>>(a, lda, jb, plan, w, c0, c1);
  // The scatter's grid covers jb rows; its blocks past the plan's count return at once.
  scatter_below_kernel<<<grid, kSwapThreads, 0, stream>>>(a, lda, jb, plan, c0, c1);
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
