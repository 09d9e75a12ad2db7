// Tensor-core grouped GEMM of the experts (te/cuda/grouped_gemm_tc.h). Why a kernel of Kiln's own
// and not cuBLAS's cublasGemmGroupedBatchedEx: the grouped cuBLAS call takes each group's m and
// pointers as host arrays, so the per-expert token counts (made on the device by the dispatch
// plan) would have to come back to the host every layer, a stream synchronisation in the middle of
// the forward and of the backward. Here every block finds its expert from the device offsets
// (te/cuda/grouped_row_tiles.cuh), so the whole MoE layer stays asynchronous.
//
// Shape of the kernel: 128 x 128 output tiles, 8 warps each computing 64 x 32 with WMMA 16x16x16
// fragments (mma.sync on sm_80+), k steps of 32 staged through shared memory by cp.async in two
// buffers (the next step's copies are in flight while this one multiplies), rows padded by 8
// elements against bank conflicts. Each operand tile is copied in its global layout (16-byte
// chunks along the contiguous dimension, zero-filled outside the expert's rows and the matrix);
// the fragment loads pick row- or column-major to match, which covers the three products:
//   forward  y = x W_e^T        A = x [rows, K] (k contiguous)   B = w[e] [O, K] (k contiguous)
//   dgrad    dx = dy W_e        A = dy [rows, O]                 B = w[e] [O, K] (n contiguous)
//   wgrad    dW_e = dy^T x      A = dy [rows, O] (m contiguous)  B = x [rows, K] (n contiguous)
// The forward and dgrad blocks are (expert, 128-row tile) x (128-column tile); the wgrad blocks
// (column tile, row tile of W, expert), each reducing over all of its expert's rows.
#include <mma.h>

#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/te/cuda/grouped_gemm_tc.h"
#include "kiln/te/cuda/grouped_row_tiles.cuh"

namespace kiln::te::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kBM = 128, kBN = 128, kBK = 32;  // block tile (m, n) and k step
// Two blocks per SM (__launch_bounds__(kThreads, 2): at most 128 registers a thread, 2 x 40 KB of
// shared memory) so one block's barrier waits overlap the other's math; ptxas (sm_90): no spills
// except 16 bytes in the data-gradient kernel.
constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kWarpM = 64, kWarpN = 32;  // warps in a 2 x 4 grid
constexpr int kFragM = kWarpM / 16, kFragN = kWarpN / 16;
constexpr int kPad = 8;    // elements of row padding (16 bytes keeps cp.async destinations aligned)
constexpr int kChunk = 8;  // elements per 16-byte copy
// One operand's stage: a [128, 32] tile stored k-contiguous or a [32, 128] one stored m/n-contiguous.
constexpr int kStageElems = kBM * (kBK + kPad);
static_assert(kStageElems >= kBK * (kBM + kPad));
constexpr int kSmemElems = 4 * kStageElems;  // A and B, two stages each
static_assert(kWarps * 16 * 16 * sizeof(float) <= kSmemElems * 2, "the epilogue's scratch reuses the stages");

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

// Copies the tile of a row-major global matrix g (leading dimension ld) at rows row0 .. row0 + Rows,
// columns col0 .. col0 + Cols into s (row stride Cols + kPad); rows >= row_hi and columns >= col_hi
// read as zeros. col_hi and col0 are multiples of kChunk, so a chunk is wholly inside or outside.
template <int Rows, int Cols, class T>
__device__ __forceinline__ void load_tile(T* s, const T* g, std::int64_t ld, std::int64_t row0, std::int64_t row_hi,
                                          std::int64_t col0, std::int64_t col_hi) {
  constexpr int kPerRow = Cols / kChunk, kChunks = Rows * kPerRow;
  static_assert(kChunks % kThreads == 0);
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = static_cast<int>(threadIdx.x) + it * kThreads;
    const int r = i / kPerRow, c = (i % kPerRow) * kChunk;
    const std::int64_t gr = row0 + r, gc = col0 + c;
    const bool ok = gr < row_hi && gc < col_hi;
    cp_async16(s + r * (Cols + kPad) + c, ok ? g + gr * ld + gc : g, ok);
  }
}

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// acc += A B over k_steps steps of kBK. load_a(s, step) / load_b(s, step) issue one step's copies;
// A is stored [m][k] when AKContiguous (else [k][m]), B [n][k] when BKContiguous (else [k][n]).
template <class T, bool AKContiguous, bool BKContiguous, class LoadA, class LoadB>
__device__ __forceinline__ void mainloop(T* smem, std::int64_t k_steps, LoadA load_a, LoadB load_b,
                                         Acc (&acc)[kFragM][kFragN]) {
  using LayoutA = std::conditional_t<AKContiguous, wmma::row_major, wmma::col_major>;
  using LayoutB = std::conditional_t<BKContiguous, wmma::col_major, wmma::row_major>;
  constexpr int kLdA = AKContiguous ? kBK + kPad : kBM + kPad;
  constexpr int kLdB = BKContiguous ? kBK + kPad : kBN + kPad;
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  if (k_steps == 0) return;
  T* const a_stage[2] = {smem, smem + kStageElems};
  T* const b_stage[2] = {smem + 2 * kStageElems, smem + 3 * kStageElems};
  const int warp = static_cast<int>(threadIdx.x) / 32, wm = warp / 4, wn = warp % 4;
  load_a(a_stage[0], 0);
  load_b(b_stage[0], 0);
  cp_async_commit();
  for (std::int64_t step = 0; step < k_steps; ++step) {
    const int cur = static_cast<int>(step & 1);
    if (step + 1 < k_steps) {  // the other buffer was last read before the previous step's barrier
      load_a(a_stage[cur ^ 1], step + 1);
      load_b(b_stage[cur ^ 1], step + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* as = a_stage[cur];
    const T* bs = b_stage[cur];
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> a[kFragM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> b[kFragN];
#pragma unroll
      for (int i = 0; i < kFragM; ++i) {
        const int m = wm * kWarpM + i * 16;
        wmma::load_matrix_sync(a[i], AKContiguous ? as + m * kLdA + kk : as + kk * kLdA + m, kLdA);
      }
#pragma unroll
      for (int j = 0; j < kFragN; ++j) {
        const int n = wn * kWarpN + j * 16;
        wmma::load_matrix_sync(b[j], BKContiguous ? bs + n * kLdB + kk : bs + kk * kLdB + n, kLdB);
      }
#pragma unroll
      for (int i = 0; i < kFragM; ++i)
#pragma unroll
        for (int j = 0; j < kFragN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
}

// Writes the warp's accumulators to out (leading dimension ld) at the block tile (m0, n0), rows below
// m_hi and columns below n_hi (a multiple of kChunk): each 16 x 16 fragment goes through the warp's
// float scratch (the stages' memory, free after the main loop), then as 16-byte vectors.
template <class T>
__device__ __forceinline__ void store_tile(const Acc (&acc)[kFragM][kFragN], T* smem, T* out, std::int64_t ld,
                                           std::int64_t m0, std::int64_t m_hi, std::int64_t n0, std::int64_t n_hi) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float* scratch = reinterpret_cast<float*>(smem) + warp * 256;
  const int r = lane / 2, c = (lane % 2) * kChunk;
#pragma unroll
  for (int i = 0; i < kFragM; ++i) {
#pragma unroll
    for (int j = 0; j < kFragN; ++j) {
      wmma::store_matrix_sync(scratch, acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      const std::int64_t gm = m0 + (warp / 4) * kWarpM + i * 16 + r;
      const std::int64_t gn = n0 + (warp % 4) * kWarpN + j * 16 + c;
      if (gm < m_hi && gn < n_hi) {
        alignas(16) T v[kChunk];
#pragma unroll
        for (int e = 0; e < kChunk; ++e) v[e] = static_cast<T>(scratch[r * 16 + c + e]);
        *reinterpret_cast<uint4*>(out + gm * ld + gn) = *reinterpret_cast<const uint4*>(v);
      }
      __syncwarp();
    }
  }
}

template <class T, bool TransW>
__global__ void __launch_bounds__(kThreads, 2)
    grouped_gemm_tc_kernel(const T* __restrict__ x, const T* __restrict__ w, const std::int64_t* __restrict__ offsets,
                           std::int64_t e_count, std::int64_t rows, std::int64_t kdim, std::int64_t odim,
                           T* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  __shared__ alignas(128) T smem[kSmemElems];
  std::int64_t expert = 0, row0 = 0, row_end = 0;
  if (!tile_of_block<kBM>(blockIdx.x, offsets, e_count, rows, &expert, &row0, &row_end)) return;
  const std::int64_t n0 = std::int64_t{blockIdx.y} * kBN;
  if (expert < 0) {  // unused rows: zeros
    const std::int64_t r_end = row0 + kBM < row_end ? row0 + kBM : row_end;
    for (std::int64_t i = threadIdx.x; i < (r_end - row0) * kBN; i += kThreads) {
      const std::int64_t r = row0 + i / kBN, o = n0 + i % kBN;
      if (o < odim) y[r * odim + o] = static_cast<T>(0.f);
    }
    return;
  }
  const T* we = w + expert * odim * kdim;
  const auto load_a = [&](T* s, std::int64_t step) {
    load_tile<kBM, kBK>(s, x, kdim, row0, row_end, step * kBK, kdim);
  };
  const auto load_b = [&](T* s, std::int64_t step) {
    if constexpr (TransW) {  // w[e] is [K, O]: B = w[e] with n contiguous
      load_tile<kBK, kBN>(s, we, odim, step * kBK, kdim, n0, odim);
    } else {  // w[e] is [O, K]: B = w[e]^T with k contiguous
      load_tile<kBN, kBK>(s, we, kdim, n0, odim, step * kBK, kdim);
    }
  };
  Acc acc[kFragM][kFragN];
  mainloop<T, true, !TransW>(smem, (kdim + kBK - 1) / kBK, load_a, load_b, acc);
  store_tile<T>(acc, smem, y, odim, row0, row_end, n0, odim);
#endif
}

// dw[e, o, c] = sum over e's rows r of dy[r, o] x[r, c]: m = o, n = c, k = the rows.
template <class T>
__global__ void __launch_bounds__(kThreads, 2)
    grouped_gemm_wgrad_tc_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                 const std::int64_t* __restrict__ offsets, std::int64_t kdim, std::int64_t odim,
                                 T* __restrict__ dw) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  __shared__ alignas(128) T smem[kSmemElems];
  const std::int64_t e = blockIdx.z, lo = offsets[e], hi = offsets[e + 1];
  const std::int64_t m0 = std::int64_t{blockIdx.y} * kBM, n0 = std::int64_t{blockIdx.x} * kBN;
  const auto load_a = [&](T* s, std::int64_t step) { load_tile<kBK, kBM>(s, dy, odim, lo + step * kBK, hi, m0, odim); };
  const auto load_b = [&](T* s, std::int64_t step) { load_tile<kBK, kBN>(s, x, kdim, lo + step * kBK, hi, n0, kdim); };
  Acc acc[kFragM][kFragN];
  mainloop<T, false, false>(smem, (hi - lo + kBK - 1) / kBK, load_a, load_b, acc);
  store_tile<T>(acc, smem, dw + e * odim * kdim, kdim, m0, odim, n0, kdim);
#endif
}

bool aligned16(const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0; }

// Calls fn.template operator()<T>() with T the CUDA type of a bf16 / f16 dtype.
template <class F>
void dispatch_half(DType dtype, F&& f) {
  if (dtype == DType::BF16) {
    f.template operator()<__nv_bfloat16>();
  } else {
    f.template operator()<__half>();
  }
}

}  // namespace

bool grouped_gemm_tc_supported(const Tensor& a, const Tensor& b, const Tensor& c) {
  const DType d = a.dtype();
  if ((d != DType::BF16 && d != DType::F16) || b.dtype() != d || c.dtype() != d) return false;
  for (const Tensor* t : {&a, &b, &c})
    if (t->shape().back() % kChunk != 0 || !aligned16(*t)) return false;
  return true;
}

void grouped_gemm_tc(const Tensor& x, const Tensor& w, const Tensor& offsets, bool trans_w, const Tensor& y) {
  const std::int64_t rows = x.shape()[0], kdim = x.shape()[1], odim = y.shape()[1], e_count = w.shape()[0];
  if (rows == 0 || odim == 0) return;
  ops::cuda::Launch launch(x);
  const dim3 grid(static_cast<unsigned>(grouped_row_tile_blocks(rows, e_count, kBM)),
                  static_cast<unsigned>((odim + kBN - 1) / kBN));
  const auto* off = static_cast<const std::int64_t*>(offsets.data_ptr());
  dispatch_half(x.dtype(), [&]<class T>() {
    const auto* xp = static_cast<const T*>(x.data_ptr());
    const auto* wp = static_cast<const T*>(w.data_ptr());
    auto* yp = static_cast<T*>(y.data_ptr());
    if (trans_w) {
      grouped_gemm_tc_kernel<T, true><<<grid, kThreads, 0, launch.stream>>>(xp, wp, off, e_count, rows, kdim, odim, yp);
    } else {
      grouped_gemm_tc_kernel<T, false>
          <<<grid, kThreads, 0, launch.stream>>>(xp, wp, off, e_count, rows, kdim, odim, yp);
    }
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void grouped_gemm_wgrad_tc(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dw) {
  const std::int64_t e_count = dw.shape()[0], odim = dw.shape()[1], kdim = dw.shape()[2];
  if (dw.numel() == 0) return;
  ops::cuda::Launch launch(x);
  const dim3 grid(static_cast<unsigned>((kdim + kBN - 1) / kBN), static_cast<unsigned>((odim + kBM - 1) / kBM),
                  static_cast<unsigned>(e_count));
  dispatch_half(x.dtype(), [&]<class T>() {
    grouped_gemm_wgrad_tc_kernel<T><<<grid, kThreads, 0, launch.stream>>>(
        static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()),
        static_cast<const std::int64_t*>(offsets.data_ptr()), kdim, odim, static_cast<T*>(dw.data_ptr()));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace kiln::te::cuda
