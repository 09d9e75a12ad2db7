// CUDA FP8 casts. The conversion is the hardware's (cvt.rn.satfinite through
// __nv_cvt_float_to_fp8: round to nearest even, saturate to the largest finite value); scales use
// the shared single-precision steps of fp8_scaling.h, so the CPU kernels produce the same bits.
// Nothing is read back to the host: amax, scale and scale_inv stay on the device (graph capturable).
//  - per tensor, delayed scaling: one pass casts with dst.scale and folds |x| into dst.amax
//    (zeroed first; atomicMax on the float's bits, which order like the non-negative floats);
//  - per tensor, current scaling: an amax pass, then the cast computes the scale from it;
//  - 1x128 blocks: one warp per block (4 elements a lane), warp-reduced amax, scale, cast;
//  - 128x128 blocks: one 256-thread CTA per tile.
// x is read through its strides, so a transposed view casts without a copy (the columnwise half
// of the transpose-cast).
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/fp8_cuda.h"
#include "kiln/ops/fp8_scaling.h"

namespace kiln::ops::cuda {

namespace {

struct Src {
  const void* p;
  std::int64_t sr, sc;
  bool contiguous;  // row-major dense: the flat index is the offset (no 64-bit division)
  template <class T>
  __device__ __forceinline__ float at(std::int64_t r, std::int64_t c) const {
    return to_float(static_cast<const T*>(p)[r * sr + c * sc]);
  }
  template <class T>
  __device__ __forceinline__ float flat(std::int64_t i, std::int64_t cols) const {
    return contiguous ? to_float(static_cast<const T*>(p)[i]) : at<T>(i / cols, i % cols);
  }
};

template <bool kE4M3>
__device__ __forceinline__ std::uint8_t to_fp8(float v) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, kE4M3 ? __NV_E4M3 : __NV_E5M2));
}

__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  // Non-negative floats order as their bit patterns; NaN never reaches here (fmaxf drops it).
  atomicMax(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
}

__device__ __forceinline__ float block_amax(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : 0.0f;
  return warp_max(v);
}

template <class T>
__global__ void amax_kernel(Src x, std::int64_t rows, std::int64_t cols, float* amax) {
  __shared__ float shared[32];
  float m = 0.0f;
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(x.flat<T>(i, cols)));
  m = block_amax(m, shared);
  if (threadIdx.x == 0) atomic_max_nonneg(amax, m);
}

// amax_kernel for a contiguous 16-bit x whose element count is a multiple of 8 and whose data is
// 16-byte aligned: 16-byte loads (8 elements), the same maximum (max is exact in any order).
template <class T>
__global__ void amax_vec8_kernel(const T* x, std::int64_t vectors, float* amax) {
  static_assert(sizeof(T) == 2, "8 elements per 16-byte load");
  __shared__ float shared[32];
  float m = 0.0f;
  const auto* v = reinterpret_cast<const uint4*>(x);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < vectors;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const uint4 raw = v[i];
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(to_float(e[k])));
  }
  m = block_amax(m, shared);
  if (threadIdx.x == 0) atomic_max_nonneg(amax, m);
}

bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// amax(x) into *amax (zeroed by the caller) for a contiguous x of n elements: 16-byte loads where
// the dtype and alignment allow.
template <class T>
void launch_amax(const void* x, std::int64_t rows, std::int64_t cols, float* amax, const Launch& l) {
  const std::int64_t n = rows * cols;
  const int threads = 256;
  if constexpr (sizeof(T) == 2) {
    if (n % 8 == 0 && aligned(x, 16)) {
      amax_vec8_kernel<T>
          <<<grid_for(n / 8, threads, l.index), threads, 0, l.stream>>>(static_cast<const T*>(x), n / 8, amax);
      KILN_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  amax_kernel<T><<<grid_for(n, threads, l.index), threads, 0, l.stream>>>(Src{x, cols, 1, true}, rows, cols, amax);
  KILN_CUDA_CHECK_LAUNCH();
}

// Per tensor. current: scale from *amax (computed by amax_kernel); else *scale as given, and the
// amax is folded in here.
template <class T, bool kE4M3>
__global__ void cast_tensor_kernel(Src x, std::int64_t rows, std::int64_t cols, std::uint8_t* q, float* scale,
                                   float* scale_inv, float* amax, bool current, bool pow2, float eps) {
  __shared__ float shared[32];
  const float max_fp8 = kE4M3 ? 448.0f : 57344.0f;
  const float s = current ? fp8::scale_from_amax(*amax, max_fp8, pow2, eps) : *scale;
  float m = 0.0f;
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = x.flat<T>(i, cols);
    m = fmaxf(m, fabsf(v));
    q[i] = to_fp8<kE4M3>(fp8::mul_rn(v, s));
  }
  if (!current) {
    m = block_amax(m, shared);
    if (threadIdx.x == 0) atomic_max_nonneg(amax, m);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (current) *scale = s;
    *scale_inv = fp8::reciprocal(s);
  }
}

// 1x128: warp w of the CTA takes block (row, cb) = linear block index; lanes take 4 columns each.
template <class T, bool kE4M3>
__global__ void cast_1x128_kernel(Src x, std::int64_t rows, std::int64_t cols, std::uint8_t* q, float* scale,
                                  float* scale_inv, float* amax, std::int64_t ld, bool pow2, float eps) {
  const std::int64_t nbc = (cols + 127) / 128;
  const std::int64_t blk = blockIdx.x * static_cast<std::int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (blk >= rows * nbc) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const std::int64_t r = blk / nbc, cb = blk % nbc, c0 = cb * 128 + lane * 4;
  float v[4];
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[j] = c0 + j < cols ? x.at<T>(r, c0 + j) : 0.0f;
    m = fmaxf(m, fabsf(v[j]));
  }
  m = warp_max(m);
  const float s = fp8::scale_from_amax(m, kE4M3 ? 448.0f : 57344.0f, pow2, eps);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (c0 + j < cols) q[r * cols + c0 + j] = to_fp8<kE4M3>(fp8::mul_rn(v[j], s));
  if (lane == 0) {
    const std::int64_t i = cb * ld + r;
    scale[i] = s;
    scale_inv[i] = fp8::reciprocal(s);
    amax[i] = m;
  }
}

// 128x128: one CTA per tile, two passes over the tile (amax, then cast).
template <class T, bool kE4M3>
__global__ void cast_128x128_kernel(Src x, std::int64_t rows, std::int64_t cols, std::uint8_t* q, float* scale,
                                    float* scale_inv, float* amax, std::int64_t ld, bool pow2, float eps) {
  __shared__ float shared[32];
  const std::int64_t nbc = (cols + 127) / 128;
  const std::int64_t rb = blockIdx.x / nbc, cb = blockIdx.x % nbc;
  const std::int64_t r0 = rb * 128, c0 = cb * 128;
  const int tc = threadIdx.x & 127, tr = threadIdx.x >> 7;  // 2 rows x 128 columns per step
  const std::int64_t c = c0 + tc;
  float m = 0.0f;
  if (c < cols)
    for (std::int64_t r = r0 + tr; r < min(rows, r0 + 128); r += 2) m = fmaxf(m, fabsf(x.at<T>(r, c)));
  m = block_amax(m, shared);
  const float s = fp8::scale_from_amax(m, kE4M3 ? 448.0f : 57344.0f, pow2, eps);
  if (c < cols)
    for (std::int64_t r = r0 + tr; r < min(rows, r0 + 128); r += 2)
      q[r * cols + c] = to_fp8<kE4M3>(fp8::mul_rn(x.at<T>(r, c), s));
  if (threadIdx.x == 0) {
    const std::int64_t i = rb * ld + cb;
    scale[i] = s;
    scale_inv[i] = fp8::reciprocal(s);
    amax[i] = m;
  }
}

template <class T, bool kE4M3>
void launch_cast(const Tensor& x, const Fp8Tensor& dst, const Fp8CastOptions& o, const Launch& l) {
  const std::int64_t R = x.shape()[0], C = x.shape()[1];
  const Src src{x.data_ptr(), x.strides()[0], x.strides()[1], x.strides()[1] == 1 && x.strides()[0] == C};
  auto* q = static_cast<std::uint8_t*>(dst.data.data_ptr());
  auto* scale = static_cast<float*>(dst.scale.data_ptr());
  auto* scale_inv = static_cast<float*>(dst.scale_inv.data_ptr());
  auto* amax = static_cast<float*>(dst.amax.data_ptr());
  switch (dst.layout) {
    case ScalingLayout::PerTensor: {
      const int threads = 256, grid = grid_for(R * C, threads, l.index);
      KILN_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), l.stream));
      if (o.current_scaling) {
        if (src.contiguous) {
          launch_amax<T>(x.data_ptr(), R, C, amax, l);
        } else {
          amax_kernel<T><<<grid, threads, 0, l.stream>>>(src, R, C, amax);
          KILN_CUDA_CHECK_LAUNCH();
        }
      }
      cast_tensor_kernel<T, kE4M3><<<grid, threads, 0, l.stream>>>(
          src, R, C, q, scale, scale_inv, amax, o.current_scaling, o.power_of_two_scales, o.amax_epsilon);
      KILN_CUDA_CHECK_LAUNCH();
      return;
    }
    case ScalingLayout::Block1x128: {
      const std::int64_t blocks = R * ((C + 127) / 128), warps_per_cta = 8;
      const auto grid = static_cast<unsigned>((blocks + warps_per_cta - 1) / warps_per_cta);
      cast_1x128_kernel<T, kE4M3><<<grid, 32 * warps_per_cta, 0, l.stream>>>(
          src, R, C, q, scale, scale_inv, amax, dst.scale.shape()[1], o.power_of_two_scales, o.amax_epsilon);
      KILN_CUDA_CHECK_LAUNCH();
      return;
    }
    case ScalingLayout::Block128x128: {
      const auto grid = static_cast<unsigned>(((R + 127) / 128) * ((C + 127) / 128));
      cast_128x128_kernel<T, kE4M3><<<grid, 256, 0, l.stream>>>(
          src, R, C, q, scale, scale_inv, amax, dst.scale.shape()[1], o.power_of_two_scales, o.amax_epsilon);
      KILN_CUDA_CHECK_LAUNCH();
      return;
    }
  }
}

// The end of a per-tensor transpose-cast CTA of 256 threads (flat index `flat`; `m` its thread's
// amax): delayed scaling folds the CTA's amax into both outputs' (a reduction by warps of the flat
// index, the CTA may be 2-D); the first CTA writes the scales, their inverses and (current scaling)
// the columnwise amax.
__device__ __forceinline__ void finish_transpose_cast(float m, int flat, float* shared, bool current, float sr,
                                                      float sc, float* row_scale, float* row_scale_inv, float* row_amax,
                                                      float* col_scale, float* col_scale_inv, float* col_amax) {
  if (!current) {
    m = warp_max(m);
    if ((flat & 31) == 0) shared[flat >> 5] = m;
    __syncthreads();
    if (flat == 0) {
      float b = 0.0f;
      for (int w = 0; w < 8; ++w) b = fmaxf(b, shared[w]);
      atomic_max_nonneg(row_amax, b);
      atomic_max_nonneg(col_amax, b);
    }
  }
  if (blockIdx.x == 0 && blockIdx.y == 0 && flat == 0) {
    if (current) {
      *row_scale = sr;
      *col_scale = sc;
      *col_amax = *row_amax;
    }
    *row_scale_inv = fp8::reciprocal(sr);
    *col_scale_inv = fp8::reciprocal(sc);
  }
}

// Fused per-tensor transpose-cast of a contiguous x [R, C]: a 32 x 32 tile is read once
// (coalesced), written row-wise from registers and column-wise through shared memory (coalesced
// along R). Delayed scaling folds amax(x) into both outputs' amax (zeroed first); current scaling
// reads it from row_amax (amax_kernel ran first).
template <class T, bool kE4M3>
__global__ void cast_transpose_kernel(const T* x, std::int64_t R, std::int64_t C, std::uint8_t* qr, std::uint8_t* qc,
                                      float* row_scale, float* row_scale_inv, float* row_amax, float* col_scale,
                                      float* col_scale_inv, float* col_amax, bool current, bool pow2, float eps) {
  __shared__ float tile[32][33];
  __shared__ float shared[32];
  const float max_fp8 = kE4M3 ? 448.0f : 57344.0f;
  const float sr = current ? fp8::scale_from_amax(*row_amax, max_fp8, pow2, eps) : *row_scale;
  const float sc = current ? sr : *col_scale;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * 32, c0 = static_cast<std::int64_t>(blockIdx.x) * 32;
  const int tx = threadIdx.x, ty = threadIdx.y;  // 32 x 8
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < 32; j += 8) {
    const std::int64_t r = r0 + ty + j, c = c0 + tx;
    if (r < R && c < C) {
      const float v = to_float(x[r * C + c]);
      m = fmaxf(m, fabsf(v));
      qr[r * C + c] = to_fp8<kE4M3>(fp8::mul_rn(v, sr));
      tile[ty + j][tx] = v;
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 32; j += 8) {
    const std::int64_t c = c0 + ty + j, r = r0 + tx;  // output row c of x^T, column r
    if (r < R && c < C) qc[c * R + r] = to_fp8<kE4M3>(fp8::mul_rn(tile[tx][ty + j], sc));
  }
  finish_transpose_cast(m, ty * 32 + tx, shared, current, sr, sc, row_scale, row_scale_inv, row_amax, col_scale,
                        col_scale_inv, col_amax);
}

// cast_transpose_kernel for a 16-bit x [R, C] with R and C multiples of 64 (x 16-byte aligned, the
// outputs 8-byte aligned): one 64 x 64 tile per CTA of 256 threads. Each thread loads two 16-byte
// vectors (8 elements of a row), writes their rowwise casts as one 8-byte word each and stages the
// values in shared memory; then writes two 8-byte words of the columnwise cast (8 consecutive rows
// of x, coalesced along R). The 32 x 32 kernel's scalar 2-byte loads and 1-byte stores ran at about
// half the memory bandwidth (docs/PERF.md, the FP8 step's breakdown). Same scales, rounding and
// amax as cast_transpose_kernel: the bytes are equal.
template <class T, bool kE4M3>
__global__ void __launch_bounds__(256)
    cast_transpose_64_kernel(const T* x, std::int64_t R, std::int64_t C, std::uint8_t* qr, std::uint8_t* qc,
                             float* row_scale, float* row_scale_inv, float* row_amax, float* col_scale,
                             float* col_scale_inv, float* col_amax, bool current, bool pow2, float eps) {
  static_assert(sizeof(T) == 2, "8 elements per 16-byte load");
  __shared__ float tile[64][65];
  __shared__ float shared[8];
  const float max_fp8 = kE4M3 ? 448.0f : 57344.0f;
  const float sr = current ? fp8::scale_from_amax(*row_amax, max_fp8, pow2, eps) : *row_scale;
  const float sc = current ? sr : *col_scale;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * 64, c0 = static_cast<std::int64_t>(blockIdx.x) * 64;
  const int t = threadIdx.x;
  float m = 0.0f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int idx = t + half * 256, row = idx >> 3, vec = idx & 7;  // 8 vectors of 8 per tile row
    const std::int64_t offset = (r0 + row) * C + c0 + vec * 8;
    const uint4 raw = *reinterpret_cast<const uint4*>(x + offset);
    const T* e = reinterpret_cast<const T*>(&raw);
    union {
      uint2 word;
      std::uint8_t bytes[8];
    } out;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float v = to_float(e[k]);
      m = fmaxf(m, fabsf(v));
      out.bytes[k] = to_fp8<kE4M3>(fp8::mul_rn(v, sr));
      tile[row][vec * 8 + k] = v;
    }
    *reinterpret_cast<uint2*>(qr + offset) = out.word;
  }
  __syncthreads();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int idx = t + half * 256, i = idx >> 3, k = idx & 7;  // row c0 + i of x^T, its columns r0 + 8k ..
    union {
      uint2 word;
      std::uint8_t bytes[8];
    } out;
#pragma unroll
    for (int j = 0; j < 8; ++j) out.bytes[j] = to_fp8<kE4M3>(fp8::mul_rn(tile[8 * k + j][i], sc));
    *reinterpret_cast<uint2*>(qc + (c0 + i) * R + r0 + 8 * k) = out.word;
  }
  finish_transpose_cast(m, t, shared, current, sr, sc, row_scale, row_scale_inv, row_amax, col_scale, col_scale_inv,
                        col_amax);
}

// Fused block transpose-cast of a contiguous x [R, C] (TransformerEngine's block-scaling
// cast-transpose): one CTA per 128 x 128 tile, staged once in shared memory (coalesced read), then
// rowwise = cast(x) and columnwise = cast(x^T), both coalesced. 1x128: the rowwise scales follow
// each tile row's amax, the columnwise ones each tile column's (the 128 rows of x it spans);
// 128x128: one amax for the tile serves both (the same block seen from either side). Each block's
// amax, scale and cast are those of cast_1x128_kernel / cast_128x128_kernel (max is exact and the
// scale arithmetic is shared), so the bytes equal two separate casts' (tests/cuda/fp8_fused_test).
constexpr int kTileDim = 128, kTilePad = 129, kTileThreads = 256;

template <class T, bool kE4M3, bool kBlock128>
__global__ void __launch_bounds__(kTileThreads)
    cast_transpose_blocks_kernel(const T* __restrict__ x, std::int64_t R, std::int64_t C, std::uint8_t* qr,
                                 std::uint8_t* qc, float* r_scale, float* r_scale_inv, float* r_amax, std::int64_t r_ld,
                                 float* c_scale, float* c_scale_inv, float* c_amax, std::int64_t c_ld, bool pow2,
                                 float eps) {
  extern __shared__ unsigned char smem_raw[];
  T* tile = reinterpret_cast<T*>(smem_raw);  // [128][129]
  __shared__ float row_scale[kTileDim], col_scale[kTileDim], shared[32];
  const float max_fp8 = kE4M3 ? 448.0f : 57344.0f;
  const std::int64_t nbc = (C + kTileDim - 1) / kTileDim;
  const std::int64_t rb = blockIdx.x / nbc, cb = blockIdx.x % nbc;
  const std::int64_t r0 = rb * kTileDim, c0 = cb * kTileDim;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  for (int i = t; i < kTileDim * kTileDim; i += kTileThreads) {
    const int r = i / kTileDim, c = i % kTileDim;
    const std::int64_t gr = r0 + r, gc = c0 + c;
    tile[r * kTilePad + c] = gr < R && gc < C ? x[gr * C + gc] : store_as<T>(0.0f);
  }
  __syncthreads();
  if constexpr (kBlock128) {
    float m = 0.0f;
    for (int i = t; i < kTileDim * kTileDim; i += kTileThreads)
      m = fmaxf(m, fabsf(to_float(tile[(i / kTileDim) * kTilePad + i % kTileDim])));
    m = block_amax(m, shared);
    const float s = fp8::scale_from_amax(m, max_fp8, pow2, eps);
    if (t < kTileDim) row_scale[t] = col_scale[t] = s;
    if (t == 0) {
      r_scale[rb * r_ld + cb] = s;
      r_scale_inv[rb * r_ld + cb] = fp8::reciprocal(s);
      r_amax[rb * r_ld + cb] = m;
      c_scale[cb * c_ld + rb] = s;  // x^T's block (cb, rb)
      c_scale_inv[cb * c_ld + rb] = fp8::reciprocal(s);
      c_amax[cb * c_ld + rb] = m;
    }
  } else {
    // 8 warps x 16 rows (then 16 columns); lanes take 4 elements each.
    for (int k = 0; k < kTileDim / 8; ++k) {
      const int line = warp * (kTileDim / 8) + k;
      float mr = 0.0f, mc = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        mr = fmaxf(mr, fabsf(to_float(tile[line * kTilePad + lane + 32 * j])));
        mc = fmaxf(mc, fabsf(to_float(tile[(lane + 32 * j) * kTilePad + line])));
      }
      mr = warp_max(mr);
      mc = warp_max(mc);
      const float sr = fp8::scale_from_amax(mr, max_fp8, pow2, eps), sc = fp8::scale_from_amax(mc, max_fp8, pow2, eps);
      if (lane == 0) {
        row_scale[line] = sr;
        col_scale[line] = sc;
        const std::int64_t gr = r0 + line, gc = c0 + line;
        if (gr < R) {  // rowwise 1x128 block (gr, cb) at cb * ld + gr
          r_scale[cb * r_ld + gr] = sr;
          r_scale_inv[cb * r_ld + gr] = fp8::reciprocal(sr);
          r_amax[cb * r_ld + gr] = mr;
        }
        if (gc < C) {  // columnwise: row gc of x^T, block rb along x's rows
          c_scale[rb * c_ld + gc] = sc;
          c_scale_inv[rb * c_ld + gc] = fp8::reciprocal(sc);
          c_amax[rb * c_ld + gc] = mc;
        }
      }
    }
  }
  __syncthreads();
  for (int i = t; i < kTileDim * kTileDim; i += kTileThreads) {
    const int r = i / kTileDim, c = i % kTileDim;
    const std::int64_t gr = r0 + r, gc = c0 + c;
    if (gr < R && gc < C) qr[gr * C + gc] = to_fp8<kE4M3>(fp8::mul_rn(to_float(tile[r * kTilePad + c]), row_scale[r]));
  }
  for (int i = t; i < kTileDim * kTileDim; i += kTileThreads) {
    const int c = i / kTileDim, r = i % kTileDim;  // x^T row c, column r: consecutive threads, consecutive r
    const std::int64_t gr = r0 + r, gc = c0 + c;
    if (gr < R && gc < C) qc[gc * R + gr] = to_fp8<kE4M3>(fp8::mul_rn(to_float(tile[r * kTilePad + c]), col_scale[c]));
  }
}

template <class T, bool kE4M3, bool kBlock128>
void launch_cast_transpose_blocks(const Tensor& x, const Fp8Tensor& row, const Fp8Tensor& col, const Fp8CastOptions& o,
                                  const Launch& l) {
  const std::int64_t R = x.shape()[0], C = x.shape()[1];
  const auto kernel = cast_transpose_blocks_kernel<T, kE4M3, kBlock128>;
  const int smem = static_cast<int>(kTileDim * kTilePad * sizeof(T));
  // f32 tiles need more than the default 48 KB of dynamic shared memory: opted into on the launch's
  // device (a host-side attribute, no synchronisation).
  if (smem > 48 * 1024)
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  auto f = [](const Tensor& t) { return static_cast<float*>(t.data_ptr()); };
  const auto grid = static_cast<unsigned>(((R + kTileDim - 1) / kTileDim) * ((C + kTileDim - 1) / kTileDim));
  kernel<<<grid, kTileThreads, smem, l.stream>>>(
      static_cast<const T*>(x.data_ptr()), R, C, static_cast<std::uint8_t*>(row.data.data_ptr()),
      static_cast<std::uint8_t*>(col.data.data_ptr()), f(row.scale), f(row.scale_inv), f(row.amax),
      row.scale.shape()[1], f(col.scale), f(col.scale_inv), f(col.amax), col.scale.shape()[1], o.power_of_two_scales,
      o.amax_epsilon);
  KILN_CUDA_CHECK_LAUNCH();
}

template <class T>
void cast_transpose_blocks(const Tensor& x, const Fp8Tensor& row, const Fp8Tensor& col, const Fp8CastOptions& o,
                           const Launch& l) {
  const bool e4m3 = row.dtype() == DType::F8E4M3, b128 = row.layout == ScalingLayout::Block128x128;
  if (e4m3 && b128) return launch_cast_transpose_blocks<T, true, true>(x, row, col, o, l);
  if (e4m3) return launch_cast_transpose_blocks<T, true, false>(x, row, col, o, l);
  if (b128) return launch_cast_transpose_blocks<T, false, true>(x, row, col, o, l);
  launch_cast_transpose_blocks<T, false, false>(x, row, col, o, l);
}

template <class T>
void cast_from(const Tensor& x, const Fp8Tensor& dst, const Fp8CastOptions& o, const Launch& l) {
  if (dst.dtype() == DType::F8E4M3)
    launch_cast<T, true>(x, dst, o, l);
  else
    launch_cast<T, false>(x, dst, o, l);
}

__device__ __forceinline__ std::int64_t scale_index(ScalingLayout layout, std::int64_t ld, std::int64_t r,
                                                    std::int64_t c) {
  switch (layout) {
    case ScalingLayout::Block1x128: return (c >> 7) * ld + r;
    case ScalingLayout::Block128x128: return (r >> 7) * ld + (c >> 7);
    default: return 0;
  }
}

template <class T>
__global__ void dequantize_kernel(const std::uint8_t* q, const float* scale_inv, ScalingLayout layout, std::int64_t ld,
                                  std::int64_t rows, std::int64_t cols, bool e4m3, T* out) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(q[i], e4m3 ? __NV_E4M3 : __NV_E5M2);
    const float v = fp8::mul_rn(__half2float(__half(h)), scale_inv[scale_index(layout, ld, i / cols, i % cols)]);
    out[i] = store_as<T>(v);
  }
}

__global__ void reciprocal_kernel(const float* scale, float* scale_inv) { *scale_inv = fp8::reciprocal(*scale); }

}  // namespace

void fp8_quantize(const Tensor& x, const Fp8Tensor& dst, const Fp8CastOptions& o) {
  Launch l(x);
  switch (x.dtype()) {
    case DType::F32: return cast_from<float>(x, dst, o, l);
    case DType::BF16: return cast_from<BFloat16>(x, dst, o, l);
    case DType::F16: return cast_from<Half>(x, dst, o, l);
    default: KILN_FAIL("fp8_quantize: dtype {} is not supported on CUDA", dtype_name(x.dtype()));
  }
}

void fp8_quantize_transpose(const Tensor& x, const Fp8Tensor& row, const Fp8Tensor& col, const Fp8CastOptions& o) {
  Launch l(x);
  if (row.layout != ScalingLayout::PerTensor) {
    switch (x.dtype()) {
      case DType::F32: return cast_transpose_blocks<float>(x, row, col, o, l);
      case DType::BF16: return cast_transpose_blocks<BFloat16>(x, row, col, o, l);
      case DType::F16: return cast_transpose_blocks<Half>(x, row, col, o, l);
      default: KILN_FAIL("fp8_quantize_transpose: dtype {} is not supported on CUDA", dtype_name(x.dtype()));
    }
  }
  const std::int64_t R = x.shape()[0], C = x.shape()[1];
  auto f = [](const Tensor& t) { return static_cast<float*>(t.data_ptr()); };
  KILN_CUDA_CHECK(cudaMemsetAsync(f(row.amax), 0, sizeof(float), l.stream));
  if (!o.current_scaling) KILN_CUDA_CHECK(cudaMemsetAsync(f(col.amax), 0, sizeof(float), l.stream));
  auto run = [&]<class T>() {
    if (o.current_scaling) launch_amax<T>(x.data_ptr(), R, C, f(row.amax), l);
    auto* qr = static_cast<std::uint8_t*>(row.data.data_ptr());
    auto* qc = static_cast<std::uint8_t*>(col.data.data_ptr());
    const auto* xp = static_cast<const T*>(x.data_ptr());
    if constexpr (sizeof(T) == 2) {
      if (R % 64 == 0 && C % 64 == 0 && R / 64 <= 65535 && aligned(xp, 16) && aligned(qr, 8) && aligned(qc, 8)) {
        const dim3 tiles(static_cast<unsigned>(C / 64), static_cast<unsigned>(R / 64));
        if (row.dtype() == DType::F8E4M3)
          cast_transpose_64_kernel<T, true><<<tiles, 256, 0, l.stream>>>(
              xp, R, C, qr, qc, f(row.scale), f(row.scale_inv), f(row.amax), f(col.scale), f(col.scale_inv),
              f(col.amax), o.current_scaling, o.power_of_two_scales, o.amax_epsilon);
        else
          cast_transpose_64_kernel<T, false><<<tiles, 256, 0, l.stream>>>(
              xp, R, C, qr, qc, f(row.scale), f(row.scale_inv), f(row.amax), f(col.scale), f(col.scale_inv),
              f(col.amax), o.current_scaling, o.power_of_two_scales, o.amax_epsilon);
        KILN_CUDA_CHECK_LAUNCH();
        return;
      }
    }
    const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>((R + 31) / 32)), block(32, 8);
    if (row.dtype() == DType::F8E4M3)
      cast_transpose_kernel<T, true><<<grid, block, 0, l.stream>>>(
          xp, R, C, qr, qc, f(row.scale), f(row.scale_inv), f(row.amax), f(col.scale), f(col.scale_inv), f(col.amax),
          o.current_scaling, o.power_of_two_scales, o.amax_epsilon);
    else
      cast_transpose_kernel<T, false><<<grid, block, 0, l.stream>>>(
          xp, R, C, qr, qc, f(row.scale), f(row.scale_inv), f(row.amax), f(col.scale), f(col.scale_inv), f(col.amax),
          o.current_scaling, o.power_of_two_scales, o.amax_epsilon);
    KILN_CUDA_CHECK_LAUNCH();
  };
  switch (x.dtype()) {
    case DType::F32: return run.template operator()<float>();
    case DType::BF16: return run.template operator()<BFloat16>();
    case DType::F16: return run.template operator()<Half>();
    default: KILN_FAIL("fp8_quantize_transpose: dtype {} is not supported on CUDA", dtype_name(x.dtype()));
  }
}

void fp8_dequantize(const Fp8Tensor& q, const Tensor& out) {
  Launch l(out);
  const std::int64_t R = q.rows(), C = q.cols();
  const int threads = 256, grid = grid_for(R * C, threads, l.index);
  const auto* d = static_cast<const std::uint8_t*>(q.data.data_ptr());
  const auto* si = static_cast<const float*>(q.scale_inv.data_ptr());
  const std::int64_t ld = q.layout == ScalingLayout::PerTensor ? 0 : q.scale_inv.shape()[1];
  const bool e4m3 = q.dtype() == DType::F8E4M3;
  auto run = [&]<class T>() {
    dequantize_kernel<T>
        <<<grid, threads, 0, l.stream>>>(d, si, q.layout, ld, R, C, e4m3, static_cast<T*>(out.data_ptr()));
    KILN_CUDA_CHECK_LAUNCH();
  };
  switch (out.dtype()) {
    case DType::F64: return run.template operator()<double>();
    case DType::F32: return run.template operator()<float>();
    case DType::BF16: return run.template operator()<BFloat16>();
    case DType::F16: return run.template operator()<Half>();
    default: KILN_FAIL("fp8_dequantize: dtype {} is not supported on CUDA", dtype_name(out.dtype()));
  }
}

namespace {

// Per block: each thread folds a run of kRun consecutive elements into its running maximum and
// flushes it whenever the scale entry changes (a 128-wide block row ends), so a thread does a few
// atomics per run, not one per element. (Per tensor takes amax_kernel: one atomic per CTA.)
constexpr int kPieceRun = 16;

template <class T>
__global__ void piece_block_amax_kernel(const T* x, std::int64_t n, std::int64_t begin, std::int64_t rows,
                                        std::int64_t cols, bool square, float* amax) {
  const std::int64_t i0 = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) * kPieceRun;
  if (i0 >= n) return;
  std::int64_t entry = -1;
  float m = 0.0f;
  for (std::int64_t i = i0; i < min(n, i0 + kPieceRun); ++i) {
    const std::int64_t e = begin + i;
    const std::int64_t k = fp8::scale_entry(false, square, rows, cols, e / cols, e % cols);
    if (k != entry) {
      if (entry >= 0) atomic_max_nonneg(amax + entry, m);
      entry = k;
      m = 0.0f;
    }
    m = fmaxf(m, fabsf(to_float(x[i])));
  }
  atomic_max_nonneg(amax + entry, m);
}

template <class T, bool kE4M3>
__global__ void piece_quantize_kernel(const T* x, std::int64_t n, std::int64_t begin, std::int64_t rows,
                                      std::int64_t cols, bool per_tensor, bool square, const float* scale,
                                      std::uint8_t* q) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t e = begin + i;
    const float s = scale[fp8::scale_entry(per_tensor, square, rows, cols, e / cols, e % cols)];
    q[i] = to_fp8<kE4M3>(fp8::mul_rn(to_float(x[i]), s));
  }
}

template <class F>
void dispatch_piece_dtype(const Tensor& x, const char* call, F&& f) {
  switch (x.dtype()) {
    case DType::F32: return f.template operator()<float>();
    case DType::BF16: return f.template operator()<BFloat16>();
    case DType::F16: return f.template operator()<Half>();
    default: KILN_FAIL("{}: dtype {} is not supported on CUDA", call, dtype_name(x.dtype()));
  }
}

}  // namespace

void fp8_piece_amax(const Tensor& x, const Fp8MatrixPiece& piece, const Tensor& amax) {
  Launch l(x);
  const std::int64_t n = x.numel();
  auto* a = static_cast<float*>(amax.data_ptr());
  const bool per_tensor = piece.layout == ScalingLayout::PerTensor;
  const bool square = piece.layout == ScalingLayout::Block128x128;
  dispatch_piece_dtype(x, "fp8_piece_amax", [&]<class T>() {
    const int threads = 256;
    if (per_tensor) {
      amax_kernel<T><<<grid_for(n, threads, l.index), threads, 0, l.stream>>>(Src{x.data_ptr(), n, 1, true}, 1, n, a);
    } else {
      const std::int64_t runs = (n + kPieceRun - 1) / kPieceRun;
      piece_block_amax_kernel<T><<<static_cast<unsigned>((runs + threads - 1) / threads), threads, 0, l.stream>>>(
          static_cast<const T*>(x.data_ptr()), n, piece.begin, piece.rows, piece.cols, square, a);
    }
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void fp8_piece_quantize(const Tensor& x, const Fp8MatrixPiece& piece, const Tensor& scale, const Tensor& dst) {
  Launch l(x);
  const std::int64_t n = x.numel();
  const bool per_tensor = piece.layout == ScalingLayout::PerTensor;
  const bool square = piece.layout == ScalingLayout::Block128x128;
  const auto* s = static_cast<const float*>(scale.data_ptr());
  auto* q = static_cast<std::uint8_t*>(dst.data_ptr());
  dispatch_piece_dtype(x, "fp8_piece_quantize", [&]<class T>() {
    const int threads = 256, grid = grid_for(n, threads, l.index);
    const auto* xp = static_cast<const T*>(x.data_ptr());
    if (dst.dtype() == DType::F8E4M3)
      piece_quantize_kernel<T, true>
          <<<grid, threads, 0, l.stream>>>(xp, n, piece.begin, piece.rows, piece.cols, per_tensor, square, s, q);
    else
      piece_quantize_kernel<T, false>
          <<<grid, threads, 0, l.stream>>>(xp, n, piece.begin, piece.rows, piece.cols, per_tensor, square, s, q);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void fp8_reciprocal(const Tensor& scale, const Tensor& scale_inv) {
  Launch l(scale);
  reciprocal_kernel<<<1, 1, 0, l.stream>>>(static_cast<const float*>(scale.data_ptr()),
                                           static_cast<float*>(scale_inv.data_ptr()));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::ops::cuda
