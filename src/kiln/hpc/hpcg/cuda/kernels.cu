// The HPCG GPU kernels and their launchers (see kernels.h). This file is compiled by nvcc and
// includes no fmt-based header: errors are checked by the host code after each launcher.
#include "kiln/hpc/hpcg/cuda/kernels.h"

namespace kiln::hpcg::gpu {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(std::int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

struct EllWriter {
  double* values;
  int* columns;
  int row;
  __device__ void operator()(int slot, int col, double value) const {
    auto e = ell_index(row, slot);
    columns[e] = col;
    values[e] = value;
  }
};

__global__ void generate_kernel(LevelLayout L, double* values, int* columns, double* rhs) {
  int row = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (row >= L.nrow) return;
  double b = generate_row(L, row, EllWriter{values, columns, row});
  if (rhs) rhs[row] = b;
}

// Row `row`'s product with x: 27 coalesced slot loads per warp; the matrix is streamed (__ldcs,
// evict-first) so that L2 keeps x's lines for the neighbouring rows.
__device__ __forceinline__ double row_dot(const double* __restrict__ values, const int* __restrict__ columns,
                                          const double* x, int row) {
  std::int64_t base = ell_index(row, 0);
  double sum = 0.0;
#pragma unroll
  for (int s = 0; s < kStencil; ++s) sum += __ldcs(values + base + s * kSlice) * x[__ldcs(columns + base + s * kSlice)];
  return sum;
}

__global__ void spmv_kernel(int nrow, const double* __restrict__ values, const int* __restrict__ columns,
                            const double* __restrict__ x, double* __restrict__ y) {
  int row = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (row < nrow) y[row] = row_dot(values, columns, x, row);
}

// Gauss-Seidel update of `count` independent rows: rows first..first+count-1, or rows[first..] when
// a list is given. The reference's arithmetic: subtract every term, add the diagonal's back.
// Slots outside `slots` are not loaded at all (the mask is the same for the whole launch, so the
// test does not diverge): the pre-smoother's forward sweep reads about half the matrix.
__global__ void relax_kernel(int first, int count, const int* __restrict__ rows, unsigned slots,
                             const double* __restrict__ values, const int* __restrict__ columns,
                             const double* __restrict__ r, double* x) {
  int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= count) return;
  int row = rows ? rows[first + t] : first + t;
  std::int64_t base = ell_index(row, 0);
  double sum = r[row];
#pragma unroll
  for (int s = 0; s < kStencil; ++s)
    if ((slots >> s) & 1u) sum -= __ldcs(values + base + s * kSlice) * x[__ldcs(columns + base + s * kSlice)];
  double diagonal = values[base + kDiagonalSlot * kSlice];
  sum += x[row] * diagonal;
  x[row] = sum / diagonal;
}

// Residual at the injected points: fine rows first..first+ncoarse-1 in order (coalesced matrix
// reads), each written to its coarse row.
__global__ void residual_restriction_kernel(int first, int ncoarse, const int* __restrict__ coarse_of_injected,
                                            const double* __restrict__ values, const int* __restrict__ columns,
                                            const double* __restrict__ r, const double* __restrict__ x,
                                            double* __restrict__ rc) {
  int q = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (q >= ncoarse) return;
  int f = first + q;
  rc[coarse_of_injected[q]] = r[f] - row_dot(values, columns, x, f);
}

__global__ void coarse_of_injected_kernel(LevelLayout coarse, int n, int* out) {
  int q = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (q < n) out[q] = coarse_of_injected(coarse, q);
}

__global__ void prolongation_kernel(int first, int ncoarse, const int* __restrict__ coarse_of_injected,
                                    const double* __restrict__ xc, double* __restrict__ x) {
  int q = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (q < ncoarse) x[first + q] += xc[coarse_of_injected[q]];
}

__global__ void waxpby_kernel(int n, double alpha, const double* x, double beta, const double* y,
                              double* w) {  // w may be x or y
  int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) w[i] = alpha * x[i] + beta * y[i];
}

__global__ void fill_kernel(std::int64_t n, double value, double* v) {
  std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v[i] = value;
}

__device__ double block_sum(double v) {
  __shared__ double warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0;
  if (threadIdx.x < 32)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

__global__ void dot_kernel(int n, const double* __restrict__ x, const double* __restrict__ y, double* partial) {
  double sum = 0.0;
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += gridDim.x * blockDim.x)
    sum += x[i] * y[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void cg_update_kernel(int n, double alpha, const double* __restrict__ p, const double* __restrict__ ap,
                                 double* __restrict__ x, double* __restrict__ r, double* partial) {
  double sum = 0.0;
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += gridDim.x * blockDim.x) {
    x[i] += alpha * p[i];
    double ri = r[i] - alpha * ap[i];
    r[i] = ri;
    sum += ri * ri;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void max_abs_difference_kernel(int n, const double* __restrict__ a, const double* __restrict__ b,
                                          double* partial) {
  __shared__ double m[kThreads];
  double v = 0.0;
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += gridDim.x * blockDim.x)
    v = fmax(v, fabs(a[i] - b[i]));
  m[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) m[threadIdx.x] = fmax(m[threadIdx.x], m[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = m[0];
}

// Sums (or maxes) the kReduceBlocks partials in one fixed order.
__global__ void finish_reduction_kernel(const double* partial, double* out, bool take_max) {
  __shared__ double s[kThreads];
  double v = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < kReduceBlocks; i += kThreads)
    v = take_max ? fmax(v, partial[i]) : v + partial[i];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k)
      s[threadIdx.x] = take_max ? fmax(s[threadIdx.x], s[threadIdx.x + k]) : s[threadIdx.x] + s[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = s[0];
}

__global__ void gather_kernel(int n, const int* __restrict__ rows, const double* __restrict__ x, double* out) {
  int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = x[rows[i]];
}

__global__ void exaggerate_kernel(LevelLayout L, double* values, double* saved, double* b) {
  int row = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (row >= L.nrow) return;
  int i, j, k;
  coords_of(L, row, i, j, k);
  double scale = diagonal_exaggeration(global_row(L, i, j, k));
  auto e = ell_index(row, kDiagonalSlot);
  saved[row] = values[e];
  values[e] *= scale;
  b[row] *= scale;
}

__global__ void restore_kernel(int nrow, double* values, const double* saved) {
  int row = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (row < nrow) values[ell_index(row, kDiagonalSlot)] = saved[row];
}

// Nonzeros of the points before index i along an axis of n points, and of the point at i.
__host__ __device__ inline std::int64_t axis_prefix(int i) { return i == 0 ? 0 : 2 + 3 * std::int64_t{i - 1}; }
__host__ __device__ inline int axis_count(int i, int n) { return 1 + (i > 0) + (i < n - 1); }

// Row offsets have a closed form (a point's nonzeros factor by axis), so no scan is needed.
template <class Index>
__global__ void generate_csr_kernel(int nx, int ny, int nz, Index* offsets, Index* columns, double* values,
                                    double* expected) {
  std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t nrow = std::int64_t{nx} * ny * nz;
  if (row >= nrow) return;
  int i = static_cast<int>(row % nx), j = static_cast<int>((row / nx) % ny);
  int k = static_cast<int>(row / (std::int64_t{nx} * ny));
  std::int64_t sx = 3 * std::int64_t{nx} - 2, sy = 3 * std::int64_t{ny} - 2;
  std::int64_t start = axis_prefix(k) * sx * sy + axis_prefix(j) * sx * axis_count(k, nz) +
                       axis_prefix(i) * axis_count(j, ny) * axis_count(k, nz);
  offsets[row] = static_cast<Index>(start);
  if (row == nrow - 1)
    offsets[nrow] = static_cast<Index>(start + axis_count(i, nx) * axis_count(j, ny) * axis_count(k, nz));
  std::int64_t e = start;
  int present = 0;
  for (int dz = -1; dz <= 1; ++dz)
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx) {
        int a = i + dx, b = j + dy, c = k + dz;
        if (a < 0 || b < 0 || c < 0 || a >= nx || b >= ny || c >= nz) continue;
        bool diagonal = dx == 0 && dy == 0 && dz == 0;
        columns[e] = static_cast<Index>(a + std::int64_t{nx} * (b + std::int64_t{ny} * c));
        values[e] = diagonal ? 26.0 : -1.0;
        ++e;
        present += diagonal ? 0 : 1;
      }
  expected[row] = 26.0 - present;  // A * ones = b of the reference problem
}

__global__ void max_abs_difference_bits_kernel(std::int64_t n, const double* a, const double* b,
                                               unsigned long long* out) {
  std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double d = fabs(a[i] - b[i]);
  if (d > 0) atomicMax(out, static_cast<unsigned long long>(__double_as_longlong(d)));
}

}  // namespace

void generate(const LevelLayout& L, double* values, int* columns, double* rhs, void* s) {
  generate_kernel<<<blocks_for(L.nrow), kThreads, 0, as_stream(s)>>>(L, values, columns, rhs);
}
void spmv(int nrow, const double* values, const int* columns, const double* x, double* y, void* s) {
  spmv_kernel<<<blocks_for(nrow), kThreads, 0, as_stream(s)>>>(nrow, values, columns, x, y);
}
void relax(int first, int count, const int* rows, unsigned slots, const double* values, const int* columns,
           const double* r, double* x, void* s) {
  relax_kernel<<<blocks_for(count), kThreads, 0, as_stream(s)>>>(first, count, rows, slots, values, columns, r, x);
}
void residual_restriction(int first, int ncoarse, const int* coarse_of_injected, const double* values,
                          const int* columns, const double* r, const double* x, double* rc, void* s) {
  residual_restriction_kernel<<<blocks_for(ncoarse), kThreads, 0, as_stream(s)>>>(first, ncoarse, coarse_of_injected,
                                                                                  values, columns, r, x, rc);
}
void fill_coarse_of_injected(const LevelLayout& coarse, int n, int* out, void* s) {
  coarse_of_injected_kernel<<<blocks_for(n), kThreads, 0, as_stream(s)>>>(coarse, n, out);
}
void prolongation(int first, int ncoarse, const int* coarse_of_injected, const double* xc, double* x, void* s) {
  prolongation_kernel<<<blocks_for(ncoarse), kThreads, 0, as_stream(s)>>>(first, ncoarse, coarse_of_injected, xc, x);
}
void waxpby(int n, double alpha, const double* x, double beta, const double* y, double* w, void* s) {
  waxpby_kernel<<<blocks_for(n), kThreads, 0, as_stream(s)>>>(n, alpha, x, beta, y, w);
}
void fill(std::int64_t n, double value, double* v, void* s) {
  fill_kernel<<<blocks_for(n), kThreads, 0, as_stream(s)>>>(n, value, v);
}
void dot_partials(int n, const double* x, const double* y, double* partial, void* s) {
  dot_kernel<<<kReduceBlocks, kThreads, 0, as_stream(s)>>>(n, x, y, partial);
}
void cg_update_partials(int n, double alpha, const double* p, const double* ap, double* x, double* r, double* partial,
                        void* s) {
  cg_update_kernel<<<kReduceBlocks, kThreads, 0, as_stream(s)>>>(n, alpha, p, ap, x, r, partial);
}
void max_abs_difference_partials(int n, const double* a, const double* b, double* partial, void* s) {
  max_abs_difference_kernel<<<kReduceBlocks, kThreads, 0, as_stream(s)>>>(n, a, b, partial);
}
void finish(const double* partial, double* out, bool take_max, void* s) {
  finish_reduction_kernel<<<1, kThreads, 0, as_stream(s)>>>(partial, out, take_max);
}
void gather(int n, const int* rows, const double* x, double* out, void* s) {
  gather_kernel<<<blocks_for(n), kThreads, 0, as_stream(s)>>>(n, rows, x, out);
}
void exaggerate_diagonal(const LevelLayout& L, double* values, double* saved, double* b, void* s) {
  exaggerate_kernel<<<blocks_for(L.nrow), kThreads, 0, as_stream(s)>>>(L, values, saved, b);
}
void restore_diagonal(int nrow, double* values, const double* saved, void* s) {
  restore_kernel<<<blocks_for(nrow), kThreads, 0, as_stream(s)>>>(nrow, values, saved);
}
void generate_csr(int nx, int ny, int nz, int* offsets, int* columns, double* values, double* expected, void* s) {
  generate_csr_kernel<int><<<blocks_for(std::int64_t{nx} * ny * nz), kThreads, 0, as_stream(s)>>>(
      nx, ny, nz, offsets, columns, values, expected);
}
void generate_csr(int nx, int ny, int nz, std::int64_t* offsets, std::int64_t* columns, double* values,
                  double* expected, void* s) {
  generate_csr_kernel<std::int64_t><<<blocks_for(std::int64_t{nx} * ny * nz), kThreads, 0, as_stream(s)>>>(
      nx, ny, nz, offsets, columns, values, expected);
}
void max_abs_difference_bits(std::int64_t n, const double* a, const double* b, unsigned long long* out_bits, void* s) {
  max_abs_difference_bits_kernel<<<blocks_for(n), kThreads, 0, as_stream(s)>>>(n, a, b, out_bits);
}

}  // namespace kiln::hpcg::gpu
