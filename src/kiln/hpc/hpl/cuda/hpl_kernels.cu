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

// [A|b] stored by rows (see the header): row i's n + 1 entries are contiguous. Each thread walks
// one column down kRowsPerThread rows (the sequence steps by 1 per row), so consecutive threads
// write consecutive entries of a row.
constexpr long kRowsPerThread = 256;

__global__ void generate_rows_kernel(double* a, long ld, long n, std::uint32_t seed, AffineStep row_step) {
  const long c = static_cast<long>(blockIdx.x) * kRowsPerBlock + threadIdx.x;
  const long i0 = static_cast<long>(blockIdx.y) * kRowsPerThread;
  if (c >= ld) return;
  const long i1 = i0 + kRowsPerThread < n ? i0 + kRowsPerThread : n;
  if (c > n) {  // the padding after b
    for (long i = i0; i < i1; ++i) a[i * ld + c] = 0.0;
    return;
  }
  std::uint64_t x = hpl_state_at(seed, n, i0, c);
  for (long i = i0; i < i1; ++i) {
    a[i * ld + c] = hpl_value(x);
    x = row_step.apply(x);
  }
}

__global__ void swap_pivot_kernel(double* panel, long ld, int jb, int k, long j, const int* amax_index, int* ipiv,
                                  double* inverse_pivot) {
  const long p = k + amax_index[0] - 1;  // cuBLAS indices are 1-based
  if (threadIdx.x == 0) {
    ipiv[j + k] = static_cast<int>(j + p);
    *inverse_pivot = 1.0 / panel[p * ld + k];
  }
  if (p == k) return;
  __syncthreads();  // the pivot is read before the thread owning column k moves it
  for (int c = threadIdx.x; c < jb; c += blockDim.x) {
    double t = panel[k * ld + c];
    panel[k * ld + c] = panel[p * ld + c];
    panel[p * ld + c] = t;
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

// Columns [c0, c1): the rows that end up on top go to w (row i at w + i * ldw, indexed by the
// column like the matrix), the top rows' old contents go to the rows below that gave up theirs.
// Two kernels, so that every read of the first (the gather) comes before any write of the second
// (the scatter): the permutation is applied at once rather than swap by swap, and neither kernel
// needs a barrier or shared memory. With the matrix stored by rows, each is a set of contiguous
// row copies: one row per blockIdx.y, consecutive columns across the threads.
constexpr int kSwapThreads = 256;
constexpr int kSwapColumnsPerThread = 4;

dim3 swap_grid(long width, int rows) {
  const long per_block = static_cast<long>(kSwapThreads) * kSwapColumnsPerThread;
  return dim3(static_cast<unsigned>((width + per_block - 1) / per_block), static_cast<unsigned>(rows));
}

// This block's share of columns [c0, c1) of one row copy: in[c] goes to out[c - out_first].
__device__ void copy_row_columns(const double* in, double* out, long out_first, long c0, long c1) {
  const long first = c0 + static_cast<long>(blockIdx.x) * kSwapThreads * kSwapColumnsPerThread + threadIdx.x;
#pragma unroll
  for (int e = 0; e < kSwapColumnsPerThread; ++e) {
    const long c = first + static_cast<long>(e) * kSwapThreads;
    if (c < c1) out[c - out_first] = in[c];
  }
}

__global__ void gather_top_kernel(const double* a, long ld, const int* plan, double* w, long ldw, long c0, long c1) {
  const long source = plan[1 + blockIdx.y];  // top_source[i]: a top row or a row below
  copy_row_columns(a + source * ld, w + static_cast<long>(blockIdx.y) * ldw, c0, c0, c1);
}

__global__ void scatter_below_kernel(double* a, long ld, int jb, const int* plan, long c0, long c1) {
  const int q = static_cast<int>(blockIdx.y);
  if (q >= plan[0]) return;
  const long row = plan[1 + jb + q];         // below_row[q]
  const long source = plan[1 + 2 * jb + q];  // below_source[q]: a top row, which no kernel here writes
  copy_row_columns(a + source * ld, a + row * ld, 0, c0, c1);
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

cudaError_t generate_matrix_rows(double* a, long ld, long n, std::uint32_t seed, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((ld + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>((n + kRowsPerThread - 1) / kRowsPerThread));
  generate_rows_kernel<<<grid, kRowsPerBlock, 0, stream>>>(a, ld, n, seed, hpl_jump(1));
  return cudaGetLastError();
}

cudaError_t swap_pivot_row(double* panel, long ld, int jb, int k, long j, const int* amax_index, int* ipiv,
                           double* inverse_pivot, cudaStream_t stream) {
  swap_pivot_kernel<<<1, 256, 0, stream>>>(panel, ld, jb, k, j, amax_index, ipiv, inverse_pivot);
  return cudaGetLastError();
}

cudaError_t build_pivot_plan(const int* ipiv, long j, int jb, int* plan, cudaStream_t stream) {
  pivot_plan_kernel<<<1, 1024, sizeof(int) * 4 * static_cast<std::size_t>(jb), stream>>>(ipiv, j, jb, plan);
  return cudaGetLastError();
}

cudaError_t swap_gather(double* a, long ld, int jb, const int* plan, double* w, long ldw, long c0, long c1,
                        cudaStream_t stream) {
  if (c1 <= c0) return cudaSuccess;
  const dim3 grid = swap_grid(c1 - c0, jb);
  gather_top_kernel<<<grid, kSwapThreads, 0, stream>>>(a, ld, plan, w, ldw, c0, c1);
  // The scatter's grid covers jb rows; its blocks past the plan's count return at once.
  scatter_below_kernel<<<grid, kSwapThreads, 0, stream>>>(a, ld, jb, plan, c0, c1);
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
