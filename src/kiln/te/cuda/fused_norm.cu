// CUDA kernels of add_rms_norm and add_layer_norm. A block per row holds the row in registers
// (up to 8 elements per thread up to 8192 columns, 16 beyond, so hidden sizes up to 16384 with
// 1024 threads; the wider variant is a separate instantiation so that the common widths keep the
// backward's five per-thread arrays in registers): it forms
// sum = x + residual, stores it rounded to the data dtype and normalises the rounded values (what
// the backward will read back), with f32 statistics. The backward walks rows with a persistent
// grid: each block keeps its columns' weight and its partial weight/bias gradients in registers,
// so dweight and dbias cost one [blocks, H] partial write and one finishing pass.
#include <array>
#include <atomic>
#include <initializer_list>

#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/te/cuda/column_sums.cuh"
#include "kiln/te/cuda/fp8_out.cuh"
#include "kiln/te/fused_ops.h"

namespace kiln::te::cuda {

using ops::cuda::block_sum;
using ops::cuda::dyn;
using ops::cuda::DynPtr;
using ops::cuda::load_as;
using ops::cuda::load_dyn;
using ops::cuda::store_as;

namespace {

constexpr std::int64_t kMaxCols = 1024 * 16;

// Elements per thread: 8 up to 8192 columns, else 16.
int per_thread_for(std::int64_t cols) { return cols <= 8192 ? 8 : 16; }

int threads_for(std::int64_t cols) {
  const int per = per_thread_for(cols);
  const std::int64_t want = (cols + per - 1) / per;
  const std::int64_t rounded = (want + 31) / 32 * 32;
  return static_cast<int>(std::clamp<std::int64_t>(rounded, 32, 1024));
}

// kFp8: the output goes to y8 (its FP8 cast, te/cuda/fp8_out.cuh) instead of y.
template <class T, bool kRms, int kPerThread, bool kFp8 = false>
__global__ void __launch_bounds__(1024)
    add_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ residual, DynPtr w, DynPtr b, float eps,
                            int cols, T* __restrict__ y, T* __restrict__ sum, float* __restrict__ mean,
                            float* __restrict__ rstd, Fp8Out y8 = {}) {
  __shared__ float shared[32];
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  const T* rr = residual ? residual + row * cols : nullptr;
  T* sr = sum + row * cols;
  float v[kPerThread];
  float total = 0;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    v[k] = 0;
    if (i < cols) {
      const T s = store_as<T>(load_as<float>(xr[i]) + (rr ? load_as<float>(rr[i]) : 0.f));
      sr[i] = s;
      v[k] = load_as<float>(s);
      total += v[k];
    }
  }
  const float m = kRms ? 0.f : block_sum(total, shared) / static_cast<float>(cols);
  float sq = 0;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < cols) sq += (v[k] - m) * (v[k] - m);
  }
  const float rs = rsqrtf(block_sum(sq, shared) / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) {
    if (!kRms) mean[row] = m;
    rstd[row] = rs;
  }
  T* yr = kFp8 ? nullptr : y + row * cols;
  const float s8 = kFp8 ? *y8.scale : 1.f;
  float m8 = 0.f;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < cols) {
      float o = (v[k] - m) * rs;
      if (w.p) o *= static_cast<float>(load_dyn(w.p, w.t, i));
      if (b.p) o += static_cast<float>(load_dyn(b.p, b.t, i));
      if constexpr (kFp8)
        m8 = fmaxf(m8, fp8_put(y8, s8, row * cols + i, load_as<float>(store_as<T>(o))));
      else
        yr[i] = store_as<T>(o);
    }
  }
  if constexpr (kFp8) fp8_finish(y8, m8, shared);
}

// dsum = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dsum_in, g = dy * w (no mean(g) term for
// RMS norm); partial_w[block][i] = sum over the block's rows of dy * xhat, partial_b of dy.
template <class T, bool kRms, int kPerThread>
__global__ void __launch_bounds__(1024)
    add_norm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ dsum, const T* __restrict__ sum, DynPtr w,
                             const float* __restrict__ mean, const float* __restrict__ rstd, std::int64_t rows,
                             int cols, T* __restrict__ dx, float* __restrict__ partial_w,
                             float* __restrict__ partial_b) {
  __shared__ float shared[32];
  float wk[kPerThread], acc_w[kPerThread], acc_b[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    wk[k] = i < cols && w.p ? static_cast<float>(load_dyn(w.p, w.t, i)) : 1.f;
    acc_w[k] = acc_b[k] = 0;
  }
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float m = kRms ? 0.f : mean[row], rs = rstd[row];
    float xh[kPerThread], g[kPerThread];
    float sum_g = 0, sum_gx = 0;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      xh[k] = g[k] = 0;
      if (i < cols) {
        const float d = load_as<float>(dy[row * cols + i]);
        xh[k] = (load_as<float>(sum[row * cols + i]) - m) * rs;
        g[k] = d * wk[k];
        sum_g += g[k];
        sum_gx += g[k] * xh[k];
        acc_w[k] += d * xh[k];
        acc_b[k] += d;
      }
    }
    const float mg = kRms ? 0.f : block_sum(sum_g, shared) / static_cast<float>(cols);
    const float mgx = block_sum(sum_gx, shared) / static_cast<float>(cols);
    if (dx) {
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < cols) {
          float o = rs * (g[k] - mg - xh[k] * mgx);
          if (dsum) o += load_as<float>(dsum[row * cols + i]);
          dx[row * cols + i] = store_as<T>(o);
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < cols) {
      if (partial_w) partial_w[std::int64_t{blockIdx.x} * cols + i] = acc_w[k];
      if (partial_b) partial_b[std::int64_t{blockIdx.x} * cols + i] = acc_b[k];
    }
  }
}

// The same two kernels for 16-bit data whose rows are whole 16-byte vectors (cols % 8 == 0, every
// pointer 16-byte aligned): a thread moves kVecs vectors of 8 adjacent elements per row instead of
// kPerThread elements a block apart. The 2-byte accesses of the kernels above left the rows'
// traffic at about a third of the H200's bandwidth (GPT-2's [16384, 768]: 59 us forward, 89 us
// backward, 2026-12-03). The per-element arithmetic is the same; the row sums group a thread's
// elements differently, so mean and rstd may differ from the scalar kernels' in the last bit.
template <class T>
using Vec8 = ops::cuda::Vec<T, 8>;

template <class T, bool kRms, int kVecs>
__global__ void __launch_bounds__(1024)
    add_norm_forward_vec_kernel(const T* __restrict__ x, const T* __restrict__ residual, DynPtr w, DynPtr b, float eps,
                                int cols, T* __restrict__ y, T* __restrict__ sum, float* __restrict__ mean,
                                float* __restrict__ rstd) {
  __shared__ float shared[32];
  const std::int64_t row = blockIdx.x;
  const int nvec = cols / 8;
  const Vec8<T>* xr = reinterpret_cast<const Vec8<T>*>(x + row * cols);
  const Vec8<T>* rr = residual ? reinterpret_cast<const Vec8<T>*>(residual + row * cols) : nullptr;
  Vec8<T>* sr = reinterpret_cast<Vec8<T>*>(sum + row * cols);
  float v[kVecs][8];
  float total = 0;
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    const int vi = threadIdx.x + c * blockDim.x;
#pragma unroll
    for (int j = 0; j < 8; ++j) v[c][j] = 0;
    if (vi < nvec) {
      const Vec8<T> xv = xr[vi];
      Vec8<T> rv{};
      if (rr) rv = rr[vi];
      Vec8<T> sv;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const T s = store_as<T>(load_as<float>(xv.v[j]) + (rr ? load_as<float>(rv.v[j]) : 0.f));
        sv.v[j] = s;
        v[c][j] = load_as<float>(s);
        total += v[c][j];
      }
      sr[vi] = sv;
    }
  }
  const float m = kRms ? 0.f : block_sum(total, shared) / static_cast<float>(cols);
  float sq = 0;
#pragma unroll
  for (int c = 0; c < kVecs; ++c)
    if (threadIdx.x + c * blockDim.x < nvec)
#pragma unroll
      for (int j = 0; j < 8; ++j) sq += (v[c][j] - m) * (v[c][j] - m);
  const float rs = rsqrtf(block_sum(sq, shared) / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) {
    if (!kRms) mean[row] = m;
    rstd[row] = rs;
  }
  Vec8<T>* yr = reinterpret_cast<Vec8<T>*>(y + row * cols);
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    const int vi = threadIdx.x + c * blockDim.x;
    if (vi >= nvec) continue;
    Vec8<T> o;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = vi * 8 + j;
      float t = (v[c][j] - m) * rs;
      if (w.p) t *= static_cast<float>(load_dyn(w.p, w.t, i));
      if (b.p) t += static_cast<float>(load_dyn(b.p, b.t, i));
      o.v[j] = store_as<T>(t);
    }
    yr[vi] = o;
  }
}

template <class T, bool kRms, int kVecs>
__global__ void __launch_bounds__(1024)
    add_norm_backward_vec_kernel(const T* __restrict__ dy, const T* __restrict__ dsum, const T* __restrict__ sum,
                                 DynPtr w, const float* __restrict__ mean, const float* __restrict__ rstd,
                                 std::int64_t rows, int cols, T* __restrict__ dx, float* __restrict__ partial_w,
                                 float* __restrict__ partial_b) {
  __shared__ float shared[32];
  const int nvec = cols / 8;
  float wk[kVecs][8], acc_w[kVecs][8], acc_b[kVecs][8];
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    const int vi = threadIdx.x + c * blockDim.x;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      wk[c][j] = vi < nvec && w.p ? static_cast<float>(load_dyn(w.p, w.t, vi * 8 + j)) : 1.f;
      acc_w[c][j] = acc_b[c][j] = 0;
    }
  }
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float m = kRms ? 0.f : mean[row], rs = rstd[row];
    const Vec8<T>* dyr = reinterpret_cast<const Vec8<T>*>(dy + row * cols);
    const Vec8<T>* sumr = reinterpret_cast<const Vec8<T>*>(sum + row * cols);
    float xh[kVecs][8], g[kVecs][8];
    float sum_g = 0, sum_gx = 0;
#pragma unroll
    for (int c = 0; c < kVecs; ++c) {
      const int vi = threadIdx.x + c * blockDim.x;
#pragma unroll
      for (int j = 0; j < 8; ++j) xh[c][j] = g[c][j] = 0;
      if (vi < nvec) {
        const Vec8<T> dv = dyr[vi], sv = sumr[vi];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float d = load_as<float>(dv.v[j]);
          xh[c][j] = (load_as<float>(sv.v[j]) - m) * rs;
          g[c][j] = d * wk[c][j];
          sum_g += g[c][j];
          sum_gx += g[c][j] * xh[c][j];
          acc_w[c][j] += d * xh[c][j];
          acc_b[c][j] += d;
        }
      }
    }
    const float mg = kRms ? 0.f : block_sum(sum_g, shared) / static_cast<float>(cols);
    const float mgx = block_sum(sum_gx, shared) / static_cast<float>(cols);
    if (dx) {
      const Vec8<T>* dsr = dsum ? reinterpret_cast<const Vec8<T>*>(dsum + row * cols) : nullptr;
      Vec8<T>* dxr = reinterpret_cast<Vec8<T>*>(dx + row * cols);
#pragma unroll
      for (int c = 0; c < kVecs; ++c) {
        const int vi = threadIdx.x + c * blockDim.x;
        if (vi >= nvec) continue;
        Vec8<T> dsv{};
        if (dsr) dsv = dsr[vi];
        Vec8<T> o;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          float t = rs * (g[c][j] - mg - xh[c][j] * mgx);
          if (dsr) t += load_as<float>(dsv.v[j]);
          o.v[j] = store_as<T>(t);
        }
        dxr[vi] = o;
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    const int vi = threadIdx.x + c * blockDim.x;
    if (vi >= nvec) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const std::int64_t at = std::int64_t{blockIdx.x} * cols + vi * 8 + j;
      if (partial_w) partial_w[at] = acc_w[c][j];
      if (partial_b) partial_b[at] = acc_b[c][j];
    }
  }
}

// The backward for hidden sizes up to 1024 (kV 16-byte vectors per lane): a warp per row, so a
// row's two sums are warp shuffles with no block barrier, and the block's 8 warps fold their
// weight/bias gradient sums into one partial row through shared memory. The block-per-row kernel
// above ran 96 threads a block at H 768 and wrote a partial row per block (2,772 rows of 768 at
// 8,192 tokens, a third more traffic than the data), 53 us a call on an H100 where the data takes 15.
// The loaded rows stay in registers as 16-bit vectors; x-hat and the scaled gradient are formed
// again for dx, which costs arithmetic, not registers.
constexpr int kWarpRowsPerBlock = 8;

template <class T, bool kRms, int kV>
__global__ void __launch_bounds__(kWarpRowsPerBlock * 32)
    add_norm_backward_warp_kernel(const T* __restrict__ dy, const T* __restrict__ dsum, const T* __restrict__ sum,
                                  DynPtr w, const float* __restrict__ mean, const float* __restrict__ rstd,
                                  std::int64_t rows, int cols, T* __restrict__ dx, float* __restrict__ partial_w,
                                  float* __restrict__ partial_b) {
  extern __shared__ float fold[];  // [kWarpRowsPerBlock, cols]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nvec = cols / 8;
  float acc_w[kV][8], acc_b[kV][8];
#pragma unroll
  for (int c = 0; c < kV; ++c)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc_w[c][j] = acc_b[c][j] = 0;
  const auto weight = [&](int i) { return w.p ? static_cast<float>(load_dyn(w.p, w.t, i)) : 1.f; };
  const std::int64_t stride = std::int64_t{gridDim.x} * kWarpRowsPerBlock;
  for (std::int64_t row = std::int64_t{blockIdx.x} * kWarpRowsPerBlock + warp; row < rows; row += stride) {
    const float m = kRms ? 0.f : mean[row], rs = rstd[row];
    const Vec8<T>* dyr = reinterpret_cast<const Vec8<T>*>(dy + row * cols);
    const Vec8<T>* sumr = reinterpret_cast<const Vec8<T>*>(sum + row * cols);
    Vec8<T> dv[kV], sv[kV];
    float sum_g = 0, sum_gx = 0;
#pragma unroll
    for (int c = 0; c < kV; ++c) {
      const int vi = lane + 32 * c;
      if (vi >= nvec) continue;
      dv[c] = dyr[vi];
      sv[c] = sumr[vi];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float d = load_as<float>(dv[c].v[j]), xh = (load_as<float>(sv[c].v[j]) - m) * rs;
        const float g = d * weight(vi * 8 + j);
        sum_g += g;
        sum_gx += g * xh;
        acc_w[c][j] += d * xh;
        acc_b[c][j] += d;
      }
    }
    const float mg = kRms ? 0.f : ops::cuda::warp_sum(sum_g) / static_cast<float>(cols);
    const float mgx = ops::cuda::warp_sum(sum_gx) / static_cast<float>(cols);
    if (!dx) continue;
    const Vec8<T>* dsr = dsum ? reinterpret_cast<const Vec8<T>*>(dsum + row * cols) : nullptr;
    Vec8<T>* dxr = reinterpret_cast<Vec8<T>*>(dx + row * cols);
#pragma unroll
    for (int c = 0; c < kV; ++c) {
      const int vi = lane + 32 * c;
      if (vi >= nvec) continue;
      Vec8<T> dsv{};
      if (dsr) dsv = dsr[vi];
      Vec8<T> o;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float xh = (load_as<float>(sv[c].v[j]) - m) * rs;
        const float g = load_as<float>(dv[c].v[j]) * weight(vi * 8 + j);
        float t = rs * (g - mg - xh * mgx);
        if (dsr) t += load_as<float>(dsv.v[j]);
        o.v[j] = store_as<T>(t);
      }
      dxr[vi] = o;
    }
  }
  // Fold the warps' sums in a fixed order (the result does not depend on timing).
  for (int pass = 0; pass < 2; ++pass) {
    float* out = pass == 0 ? partial_w : partial_b;
    if (!out) continue;
#pragma unroll
    for (int c = 0; c < kV; ++c) {
      const int vi = lane + 32 * c;
      if (vi >= nvec) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) fold[warp * cols + vi * 8 + j] = pass == 0 ? acc_w[c][j] : acc_b[c][j];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
      float s = 0;
#pragma unroll
      for (int k = 0; k < kWarpRowsPerBlock; ++k) s += fold[k * cols + i];
      out[std::int64_t{blockIdx.x} * cols + i] = s;
    }
    __syncthreads();
  }
}

// The warp-per-row backward's variant for a width (16-byte vectors per lane, 1 to 4), its shared
// memory, and how many of its blocks an SM holds (the grid: more blocks only add partial rows).
constexpr std::int64_t kWarpRowsMaxCols = 32 * 8 * 4;

template <class T, bool kRms>
auto warp_rows_backward_kernel(std::int64_t cols) {
  switch ((cols / 8 + 31) / 32) {
    case 1: return add_norm_backward_warp_kernel<T, kRms, 1>;
    case 2: return add_norm_backward_warp_kernel<T, kRms, 2>;
    case 3: return add_norm_backward_warp_kernel<T, kRms, 3>;
    default: return add_norm_backward_warp_kernel<T, kRms, 4>;
  }
}

std::size_t warp_rows_shared_bytes(std::int64_t cols) {
  return static_cast<std::size_t>(kWarpRowsPerBlock * cols) * sizeof(float);
}

// Asked of the driver once per width (the occupancy query costs microseconds of host time a call).
int warp_rows_blocks_per_sm(DType dtype, bool rms, std::int64_t cols) {
  static std::array<std::atomic<int>, 2 * 2 * (kWarpRowsMaxCols / 8 + 1)> known{};
  std::atomic<int>& slot =
      known[static_cast<std::size_t>(((dtype == DType::BF16) * 2 + rms) * (kWarpRowsMaxCols / 8 + 1) + cols / 8)];
  if (const int n = slot.load(std::memory_order_relaxed); n > 0) return n;
  int n = 0;
  const std::size_t shared = warp_rows_shared_bytes(cols);
  KILN_DISPATCH_FLOATING(dtype, "add_norm_backward", [&]<class T>() {
    if constexpr (sizeof(T) == 2) {
      const auto kernel = rms ? warp_rows_backward_kernel<T, true>(cols) : warp_rows_backward_kernel<T, false>(cols);
      KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kWarpRowsPerBlock * 32, shared));
    }
  });
  n = std::max(1, n);
  slot.store(n, std::memory_order_relaxed);
  return n;
}

template <class T>
const T* cptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}
template <class T>
T* mptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

void check_cols(const char* op, std::int64_t cols) {
  KILN_CHECK(cols <= kMaxCols, "{}: the CUDA kernel handles hidden sizes up to {}, got {}", op, kMaxCols, cols);
}

// The vector kernels' conditions: 16-bit data, rows of whole 16-byte vectors, aligned pointers.
bool vector_rows(std::int64_t cols, std::initializer_list<const Tensor*> tensors) {
  if (cols % 8 != 0) return false;
  for (const Tensor* t : tensors)
    if (t->defined() && !ops::cuda::aligned16(t->data_ptr())) return false;
  return true;
}

// Vectors per thread (1 up to 8192 columns, else 2) and threads per block for the vector kernels.
int vecs_for(std::int64_t cols) { return cols / 8 <= 1024 ? 1 : 2; }
int vec_threads_for(std::int64_t cols) {
  const std::int64_t per = vecs_for(cols), want = (cols / 8 + per - 1) / per;
  return static_cast<int>(std::clamp<std::int64_t>((want + 31) / 32 * 32, 32, 1024));
}

template <bool kRms>
void forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
             const Tensor& sum, const Tensor& mean, const Tensor& rstd, const Fp8Tensor* y8 = nullptr) {
  const char* op = kRms ? "add_rms_norm" : "add_layer_norm";
  const std::int64_t rows = rstd.numel(), cols = x.numel() / rows;
  check_cols(op, cols);
  ops::cuda::Launch launch(x);
  const int threads = threads_for(cols);
  KILN_DISPATCH_FLOATING(x.dtype(), op, [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("{}: float64 runs on the CPU only", op);
    } else {
      if constexpr (sizeof(T) == 2) {
        if (y8 == nullptr && vector_rows(cols, {&x, &residual, &y, &sum})) {
          auto kernel =
              vecs_for(cols) == 1 ? add_norm_forward_vec_kernel<T, kRms, 1> : add_norm_forward_vec_kernel<T, kRms, 2>;
          kernel<<<static_cast<unsigned>(rows), vec_threads_for(cols), 0, launch.stream>>>(
              cptr<T>(x), cptr<T>(residual), dyn(w), dyn(b), static_cast<float>(eps), static_cast<int>(cols),
              mptr<T>(y), mptr<T>(sum), mptr<float>(mean), mptr<float>(rstd));
          KILN_CUDA_CHECK_LAUNCH();
          return;
        }
      }
      const bool wide = per_thread_for(cols) != 8;
      auto kernel = y8 ? (wide ? add_norm_forward_kernel<T, kRms, 16, true> : add_norm_forward_kernel<T, kRms, 8, true>)
                       : (wide ? add_norm_forward_kernel<T, kRms, 16> : add_norm_forward_kernel<T, kRms, 8>);
      const Fp8Out out8 = y8 ? fp8_out(*y8, launch.stream) : Fp8Out{};
      kernel<<<static_cast<unsigned>(rows), threads, 0, launch.stream>>>(
          cptr<T>(x), cptr<T>(residual), dyn(w), dyn(b), static_cast<float>(eps), static_cast<int>(cols), mptr<T>(y),
          mptr<T>(sum), mptr<float>(mean), mptr<float>(rstd), out8);
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
}

template <bool kRms>
void backward(const Tensor& dy, const Tensor& dsum, const Tensor& sum, const Tensor& w, const Tensor& mean,
              const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db) {
  const char* op = kRms ? "add_rms_norm_backward" : "add_layer_norm_backward";
  const std::int64_t rows = rstd.numel(), cols = sum.numel() / rows;
  check_cols(op, cols);
  ops::cuda::Launch launch(sum);
  const bool vec = dtype_size(sum.dtype()) == 2 && vector_rows(cols, {&dy, &dsum, &sum, &dx});
  const bool warp_rows = vec && cols <= kWarpRowsMaxCols;
  const int threads = warp_rows ? kWarpRowsPerBlock * 32 : vec ? vec_threads_for(cols) : threads_for(cols);
  const auto& info = ops::cuda::device_info(launch.index);
  const std::int64_t blocks =
      warp_rows ? std::min<std::int64_t>(
                      (rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock,
                      static_cast<std::int64_t>(info.sms) * warp_rows_blocks_per_sm(sum.dtype(), kRms, cols))
                : std::min<std::int64_t>(
                      rows, static_cast<std::int64_t>(info.sms) * std::max(1, info.max_threads_per_sm / threads));
  Tensor partial_w = dw.defined() ? Tensor::empty({blocks, cols}, DType::F32, sum.device()) : Tensor();
  Tensor partial_b = db.defined() ? Tensor::empty({blocks, cols}, DType::F32, sum.device()) : Tensor();
  KILN_DISPATCH_FLOATING(sum.dtype(), op, [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("{}: float64 runs on the CPU only", op);
    } else {
      if constexpr (sizeof(T) == 2) {
        if (warp_rows) {
          warp_rows_backward_kernel<T, kRms>(
              cols)<<<static_cast<unsigned>(blocks), threads, warp_rows_shared_bytes(cols), launch.stream>>>(
              cptr<T>(dy), cptr<T>(dsum), cptr<T>(sum), dyn(w), cptr<float>(mean), cptr<float>(rstd), rows,
              static_cast<int>(cols), mptr<T>(dx), mptr<float>(partial_w), mptr<float>(partial_b));
          KILN_CUDA_CHECK_LAUNCH();
          return;
        }
        if (vec) {
          auto kernel =
              vecs_for(cols) == 1 ? add_norm_backward_vec_kernel<T, kRms, 1> : add_norm_backward_vec_kernel<T, kRms, 2>;
          kernel<<<static_cast<unsigned>(blocks), threads, 0, launch.stream>>>(
              cptr<T>(dy), cptr<T>(dsum), cptr<T>(sum), dyn(w), cptr<float>(mean), cptr<float>(rstd), rows,
              static_cast<int>(cols), mptr<T>(dx), mptr<float>(partial_w), mptr<float>(partial_b));
          KILN_CUDA_CHECK_LAUNCH();
          return;
        }
      }
      auto kernel =
          per_thread_for(cols) == 8 ? add_norm_backward_kernel<T, kRms, 8> : add_norm_backward_kernel<T, kRms, 16>;
      kernel<<<static_cast<unsigned>(blocks), threads, 0, launch.stream>>>(
          cptr<T>(dy), cptr<T>(dsum), cptr<T>(sum), dyn(w), cptr<float>(mean), cptr<float>(rstd), rows,
          static_cast<int>(cols), mptr<T>(dx), mptr<float>(partial_w), mptr<float>(partial_b));
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
  if (dw.defined()) finish_column_sums(partial_w, dw, launch.stream);
  if (db.defined()) finish_column_sums(partial_b, db, launch.stream);
}

}  // namespace

void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, double eps, const Tensor& y,
                          const Tensor& sum, const Tensor& rstd) {
  forward<true>(x, residual, w, Tensor(), eps, y, sum, Tensor(), rstd);
}

void add_rms_norm_backward(const Tensor& dy, const Tensor& dsum, const Tensor& sum, const Tensor& w, const Tensor& rstd,
                           const Tensor& dx, const Tensor& dw) {
  backward<true>(dy, dsum, sum, w, Tensor(), rstd, dx, dw, Tensor());
}

void add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps,
                            const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd) {
  forward<false>(x, residual, w, b, eps, y, sum, mean, rstd);
}

void add_rms_norm_fp8_forward(const Tensor& x, const Tensor& residual, const Tensor& w, double eps, const Fp8Tensor& y8,
                              const Tensor& sum, const Tensor& rstd) {
  forward<true>(x, residual, w, Tensor(), eps, Tensor(), sum, Tensor(), rstd, &y8);
}

void add_layer_norm_fp8_forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps,
                                const Fp8Tensor& y8, const Tensor& sum, const Tensor& mean, const Tensor& rstd) {
  forward<false>(x, residual, w, b, eps, Tensor(), sum, mean, rstd, &y8);
}

void add_layer_norm_backward(const Tensor& dy, const Tensor& dsum, const Tensor& sum, const Tensor& w,
                             const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dw,
                             const Tensor& db) {
  backward<false>(dy, dsum, sum, w, mean, rstd, dx, dw, db);
}

}  // namespace kiln::te::cuda
