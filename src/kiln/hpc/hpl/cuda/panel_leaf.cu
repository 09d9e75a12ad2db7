// The fused leaf of the GPU panel factorisation (see panel_leaf.h).
//
// The leaf's rows [k0, m) are split into one contiguous chunk per block; a block only ever writes
// its own rows, and its share of the panel columns outside the leaf, across which it carries each
// interchange (nobody else touches those during the leaf; column c always belongs to the same
// thread, so the interchanges reach it in order). Per column k:
//   1. every block has published its best candidate for column k (|value|, row, and that row's
//      leaf values from column k on) into slot [k parity][block], and the owner of row k has
//      published row k the same way; one grid barrier;
//   2. every block picks the same winner p (largest |value|, then lowest row, as idamax does),
//      copies the pivot row and row k from the slots, the owners write them into rows k and p;
//   3. every block scales its rows of column k and updates its rows of the later leaf columns,
//      and on the way finds its best candidate for column k+1, which it publishes into the slots
//      of the other parity.
// The slots alternate by parity, so a block that has reached step 3 of column k never overwrites
// what a slower block still reads in step 2 of column k; one barrier per column suffices.
// Values written by another block are read with __ldcg (L2, not a possibly stale L1 line).
#include <cooperative_groups.h>

#include <climits>

#include "kiln/hpc/hpl/cuda/panel_leaf.h"

namespace kiln::hpl::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// A candidate slot: |pivot|, its row, and the row's leaf values from the current column on.
constexpr int kSlot = 2 + kMaxLeafWidth;

struct Best {
  double value;  // |a|, or -1 for "no candidate"
  long row;
};

__device__ bool better(double value, long row, const Best& than) {
  return value > than.value || (value == than.value && row < than.row);
}

// The block's best (value, row); every thread gets it.
__device__ Best block_best(Best b, double* s_value, long* s_row) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const double v = __shfl_down_sync(0xffffffffu, b.value, offset);
    const long r = __shfl_down_sync(0xffffffffu, b.row, offset);
    if (better(v, r, b)) b = {v, r};
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    s_value[warp] = b.value;
    s_row[warp] = b.row;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < kWarps; ++w)
      if (better(s_value[w], s_row[w], Best{s_value[0], s_row[0]})) {
        s_value[0] = s_value[w];
        s_row[0] = s_row[w];
      }
  __syncthreads();
  const Best out{s_value[0], s_row[0]};
  __syncthreads();  // s_value/s_row are reused by the next reduction
  return out;
}

// A block's rows of the leaf: in shared memory (kTiled: loaded once, written back at the end, so
// each column costs no global traffic) or, when the rows do not fit, in the matrix itself, which
// is stored by rows (entry (r, c) at panel[r * ld + c]).
template <bool kTiled>
struct LeafRows {
  double* panel;
  long ld;
  double* tile;  // w columns of `stride` entries (an odd stride: see tile_stride)
  int k0;
  long r_begin, stride;
  __device__ double& operator()(int c, long r) const {
    if constexpr (kTiled) return tile[static_cast<long>(c - k0) * stride + (r - r_begin)];
    return panel[r * ld + c];
  }
};

// The tile keeps each leaf column contiguous (the per-column loops run over rows), padded to an odd
// length so that loading a row's w consecutive entries from the matrix spreads over the banks.
__host__ __device__ inline long tile_stride(long chunk) { return chunk | 1; }

// Writes this block's candidate for column k into `slot` and, from the owner of row k, row k into
// `row_k`; both with the whole leaf row (columns k0..end), so whoever takes the row's place gets
// its finished L entries too. Reads only this block's own rows.
template <bool kTiled>
__device__ void publish(const LeafRows<kTiled>& at, int k, int end, Best local, long r_end, double* slot, double* row_k,
                        double* s_value, long* s_row) {
  const Best best = block_best(local, s_value, s_row);
  const int t = threadIdx.x;
  if (t == 0) {
    slot[0] = best.value;
    slot[1] = static_cast<double>(best.row);
  }
  if (best.value >= 0)
    for (int c = at.k0 + t; c < end; c += kThreads) slot[2 + c - at.k0] = at(c, best.row);
  if (k >= at.r_begin && k < r_end)
    for (int c = at.k0 + t; c < end; c += kThreads) row_k[c - at.k0] = at(c, k);
}

template <bool kTiled>
__global__ void __launch_bounds__(kThreads) leaf_kernel(double* panel, long ld, long m, int jb, int k0, int w, long j,
                                                        int* ipiv, double* scratch, long chunk, int swap_blocks) {
  cg::grid_group grid = cg::this_grid();
  extern __shared__ double tile[];
  __shared__ double s_value[kWarps];
  __shared__ long s_row[kWarps];
  __shared__ double pivot_row[kMaxLeafWidth], old_row_k[kMaxLeafWidth];
  const int blocks = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x), t = static_cast<int>(threadIdx.x);
  const int end = k0 + w;
  const long r_begin = k0 + static_cast<long>(b) * chunk;
  const long r_end = r_begin + chunk < m ? r_begin + chunk : m;
  const LeafRows<kTiled> at{panel, ld, tile, k0, r_begin, tile_stride(chunk)};
  auto slot = [&](int parity, int block) { return scratch + (static_cast<long>(parity) * blocks + block) * kSlot; };
  auto row_k_slot = [&](int parity) { return scratch + 2L * blocks * kSlot + parity * kMaxLeafWidth; };
  auto entry = [&](long r, int c) -> double& { return panel[r * ld + c]; };
  // Every (row, column) of the block's rows of the leaf, w consecutive entries a row, so that
  // consecutive threads touch consecutive entries of the matrix.
  auto each_tile_entry = [&](auto&& f) {
    const long entries = r_end > r_begin ? (r_end - r_begin) * w : 0;
    for (long e = t; e < entries; e += kThreads) f(r_begin + e / w, k0 + static_cast<int>(e % w));
  };

  if constexpr (kTiled) {
    each_tile_entry([&](long r, int c) { at(c, r) = entry(r, c); });
    __syncthreads();
  }
  {  // Column k0's candidates.
    Best local{-1.0, LONG_MAX};
    for (long r = (r_begin > k0 ? r_begin : k0) + t; r < r_end; r += kThreads) {
      const double v = fabs(at(k0, r));
      if (better(v, r, local)) local = {v, r};
    }
    publish(at, k0, end, local, r_end, slot(0, b), row_k_slot(0), s_value, s_row);
  }
  grid.sync();

  for (int k = k0; k < end; ++k) {
    const int parity = (k - k0) & 1;
    // 2. The winner, the same in every block.
    Best mine{-1.0, LONG_MAX};
    for (int s = t; s < blocks; s += kThreads) {
      const double* c = slot(parity, s);
      const double v = __ldcg(c);
      const long r = static_cast<long>(__ldcg(c + 1));
      if (v >= 0 && better(v, r, mine)) mine = {v, r};
    }
    const Best winner = block_best(mine, s_value, s_row);
    // No candidate anywhere means the column holds only NaNs: keep row k; the NaNs then reach
    // the residual check, which fails the run as HPL's would.
    const bool none = !(winner.value >= 0);
    const long p = none ? k : winner.row;
    const double* source = none ? row_k_slot(parity) : slot(parity, static_cast<int>((p - k0) / chunk)) + 2;
    for (int c = t; c < w; c += kThreads) {
      pivot_row[c] = __ldcg(source + c);
      old_row_k[c] = __ldcg(row_k_slot(parity) + c);
    }
    __syncthreads();
    if (b == 0 && t == 0) ipiv[j + k] = static_cast<int>(j + p);
    if (p != k) {
      // The panel's columns outside the leaf, spread over the first swap_blocks blocks: while one
      // block walked them all (2 x 2000 entries at NB=2048, when the matrix was stored by columns
      // and each was in its own sector) every other block waited at the next barrier.
      if (b < swap_blocks)
        for (int c = b * kThreads + t; c < jb; c += swap_blocks * kThreads) {
          if (c >= k0 && c < end) continue;
          const double x = entry(k, c), y = entry(p, c);
          entry(k, c) = y;
          entry(p, c) = x;
        }
      if (p >= r_begin && p < r_end)
        for (int c = t; c < w; c += kThreads) at(k0 + c, p) = old_row_k[c];
    }
    if (k >= r_begin && k < r_end)
      for (int c = t; c < w; c += kThreads) at(k0 + c, k) = pivot_row[c];
    __syncthreads();

    // 3. Scale and update this block's rows below k; track column k+1's best on the way.
    const double inverse = 1.0 / pivot_row[k - k0];
    Best local{-1.0, LONG_MAX};
    for (long r = (r_begin > k + 1 ? r_begin : k + 1) + t; r < r_end; r += kThreads) {
      const double l = at(k, r) * inverse;
      at(k, r) = l;
      for (int c = k + 1; c < end; ++c) {
        const double v = at(c, r) - l * pivot_row[c - k0];
        at(c, r) = v;
        if (c == k + 1 && better(fabs(v), r, local)) local = {fabs(v), r};
      }
    }
    if (k + 1 < end) {
      __syncthreads();  // the block's updated rows are read back for its candidate
      publish(at, k + 1, end, local, r_end, slot(parity ^ 1, b), row_k_slot(parity ^ 1), s_value, s_row);
      grid.sync();
    }
  }
  if constexpr (kTiled) {
    __syncthreads();
    each_tile_entry([&](long r, int c) { entry(r, c) = at(c, r); });
  }
}

}  // namespace

std::size_t leaf_scratch_doubles(int blocks) {
  return 2 * static_cast<std::size_t>(blocks) * kSlot + 2 * static_cast<std::size_t>(kMaxLeafWidth);
}

int leaf_max_blocks(int device) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 1;
  // One block per SM at most: the blocks spread over SMs, and the rest stay with the update.
  return sms > 0 ? sms : 1;
}

std::size_t leaf_tile_capacity(int device) {
  int optin = 0;
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return 0;
  // Less the kernel's static shared memory (pivot rows and the reduction), rounded generously.
  return optin > 4096 ? static_cast<std::size_t>(optin - 4096) : 0;
}

cudaError_t factor_leaf(double* panel, long ld, long m, int jb, int k0, int w, long j, int* ipiv, double* scratch,
                        int blocks, cudaStream_t stream, std::size_t tile_bytes, int swap_blocks) {
  if (w <= 0) return cudaSuccess;
  if (w > kMaxLeafWidth || blocks < 1) return cudaErrorInvalidValue;
  long chunk = (m - k0 + blocks - 1) / blocks;
  swap_blocks = swap_blocks < 1 || swap_blocks > blocks ? blocks : swap_blocks;
  void* args[] = {&panel, &ld, &m, &jb, &k0, &w, &j, &ipiv, &scratch, &chunk, &swap_blocks};
  const std::size_t need = sizeof(double) * static_cast<std::size_t>(tile_stride(chunk)) * w;
  if (need <= tile_bytes) {
    const void* kernel = reinterpret_cast<const void*>(leaf_kernel<true>);
    if (cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(need));
        e != cudaSuccess)
      return e;
    return cudaLaunchCooperativeKernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), args, need, stream);
  }
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(leaf_kernel<false>),
                                     dim3(static_cast<unsigned>(blocks)), dim3(kThreads), args, 0, stream);
}

}  // namespace kiln::hpl::cuda
