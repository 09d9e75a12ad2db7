#pragma once
// Shared helpers of the CUDA kernels: element types on the device, conversions through float,
// strided indexing (coalesced N-d descriptors), launch sizes, warp/block reductions and a small
// scratch-buffer helper on top of the caching allocator. Included by ops/cuda/*.cu only.
#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <type_traits>

#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/ops/op_kinds.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/scalar_types.h"
#include "kiln/runtime/vendor/cuda.h"
#include "kiln/tensor/tensor.h"

namespace kiln::ops::cuda {

// ---- element types and conversions -------------------------------------------------------------

// The type a kernel computes in: double for f64 and integers (as on the CPU), float otherwise.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double> || std::is_integral_v<T>, double, float>;

template <class T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return __uint_as_float(static_cast<std::uint32_t>(v.bits) << 16);
  } else if constexpr (std::is_same_v<T, Half>) {
    __half h = __ushort_as_half(v.bits);
    return __half2float(h);
  } else {
    return static_cast<float>(v);
  }
}

// Any stored type to the accumulation type A (float or double).
template <class A, class T>
__device__ __forceinline__ A load_as(T v) {
  if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
    return static_cast<A>(to_float(v));
  } else if constexpr (std::is_same_v<T, Float8E4M3> || std::is_same_v<T, Float8E5M2>) {
    return static_cast<A>(static_cast<float>(v));
  } else {
    return static_cast<A>(v);
  }
}

// A float/double value to a stored type, rounding to nearest even as the CPU does.
template <class T, class A>
__device__ __forceinline__ T store_as(A v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    T out;
    out.bits = __bfloat16_as_ushort(__float2bfloat16_rn(static_cast<float>(v)));
    return out;
  } else if constexpr (std::is_same_v<T, Half>) {
    T out;
    out.bits = __half_as_ushort(__float2half_rn(static_cast<float>(v)));
    return out;
  } else if constexpr (std::is_same_v<T, Float8E4M3> || std::is_same_v<T, Float8E5M2>) {
    return T(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != A(0);
  } else {
    return static_cast<T>(v);
  }
}

// Per-channel parameters and statistics may be stored in another dtype than the data (f32 stats for
// bf16 activations): these read/write one element of a floating tensor by a runtime dtype.
__device__ __forceinline__ double load_dyn(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::BF16: return to_float(static_cast<const BFloat16*>(p)[i]);
    case DType::F16: return to_float(static_cast<const Half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
__device__ __forceinline__ void store_dyn(void* p, DType t, std::int64_t i, double v) {
  switch (t) {
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    case DType::BF16: static_cast<BFloat16*>(p)[i] = store_as<BFloat16>(static_cast<float>(v)); break;
    case DType::F16: static_cast<Half*>(p)[i] = store_as<Half>(static_cast<float>(v)); break;
    default: static_cast<float*>(p)[i] = static_cast<float>(v); break;
  }
}

// A possibly-undefined tensor as (pointer, dtype) for load_dyn/store_dyn; nullptr when undefined.
struct DynPtr {
  void* p = nullptr;
  DType t = DType::F32;
};
inline DynPtr dyn(const Tensor& t) { return t.defined() ? DynPtr{t.data_ptr(), t.dtype()} : DynPtr{}; }

// ---- strided indexing ---------------------------------------------------------------------------

inline constexpr int kMaxDims = 8;

// N tensors of one shape with their own strides, dims coalesced (outermost first). offset(i, t)
// maps a linear (row-major) element index to tensor t's element offset.
template <int N>
struct Indexer {
  int ndim = 0;
  bool small = true;  // every size and offset fits 32 bits: cheaper division
  std::int64_t sizes[kMaxDims];
  std::int64_t strides[N][kMaxDims];

  __device__ __forceinline__ void offsets(std::int64_t linear, std::int64_t (&out)[N]) const {
#pragma unroll
    for (int t = 0; t < N; ++t) out[t] = 0;
    if (small) {
      std::uint32_t rem = static_cast<std::uint32_t>(linear);
      for (int d = ndim - 1; d >= 0; --d) {
        std::uint32_t sz = static_cast<std::uint32_t>(sizes[d]);
        std::uint32_t q = rem / sz;
        std::uint32_t r = rem - q * sz;
        rem = q;
#pragma unroll
        for (int t = 0; t < N; ++t) out[t] += static_cast<std::int64_t>(r) * strides[t][d];
      }
    } else {
      std::int64_t rem = linear;
      for (int d = ndim - 1; d >= 0; --d) {
        std::int64_t q = rem / sizes[d];
        std::int64_t r = rem - q * sizes[d];
        rem = q;
#pragma unroll
        for (int t = 0; t < N; ++t) out[t] += r * strides[t][d];
      }
    }
  }
};

// Builds an Indexer for `shape` with the given per-tensor strides, merging dims that are
// contiguous in every tensor and dropping size-1 dims. Throws past kMaxDims.
template <int N>
Indexer<N> make_indexer(const Shape& shape, const std::array<const Strides*, N>& strides) {
  Indexer<N> ix;
  std::int64_t extent = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = ix.ndim > 0;
    for (int t = 0; t < N && merge; ++t) merge = ix.strides[t][ix.ndim - 1] == (*strides[t])[d] * shape[d];
    if (merge) {
      ix.sizes[ix.ndim - 1] *= shape[d];
      for (int t = 0; t < N; ++t) ix.strides[t][ix.ndim - 1] = (*strides[t])[d];
    } else {
      KILN_CHECK(ix.ndim < kMaxDims, "cuda kernel: more than {} non-mergeable dimensions in shape {}", kMaxDims,
                 shape_str(shape));
      ix.sizes[ix.ndim] = shape[d];
      for (int t = 0; t < N; ++t) ix.strides[t][ix.ndim] = (*strides[t])[d];
      ++ix.ndim;
    }
  }
  for (int d = 0; d < ix.ndim; ++d) {
    extent *= ix.sizes[d];
    for (int t = 0; t < N; ++t) {
      std::int64_t s = ix.strides[t][d] < 0 ? -ix.strides[t][d] : ix.strides[t][d];
      if (s * ix.sizes[d] >= (std::int64_t{1} << 31)) ix.small = false;
    }
  }
  if (extent >= (std::int64_t{1} << 31)) ix.small = false;
  return ix;
}

// True when every tensor is contiguous with the same layout (one flat loop).
template <int N>
bool is_flat(const Indexer<N>& ix) {
  if (ix.ndim > 1) return false;
  for (int t = 0; t < N; ++t)
    if (ix.ndim == 1 && ix.strides[t][0] != 1) return false;
  return true;
}

// ---- launch helpers -----------------------------------------------------------------------------

inline int grid_for(std::int64_t n, int threads, int index, int waves = 4) {
  std::int64_t blocks = (n + threads - 1) / threads;
  const auto& di = device_info(index);
  std::int64_t cap = static_cast<std::int64_t>(di.sms) * (di.max_threads_per_sm / threads) * waves;
  return static_cast<int>(std::max<std::int64_t>(1, std::min(blocks, cap)));
}

// Device + stream of a tensor, with the device made current for the scope.
struct Launch {
  DeviceGuard guard;
  cudaStream_t stream;
  int index;
  explicit Launch(const Tensor& t)
      : guard(t.device().index), stream(cuda_stream(t.device().index)), index(t.device().index) {}
};

// ---- warp / block reductions --------------------------------------------------------------------

template <class T, class Combine>
__device__ __forceinline__ T warp_reduce(T v, Combine combine) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  return warp_reduce(v, [](float a, float b) { return a + b; });
}
__device__ __forceinline__ double warp_sum(double v) {
  return warp_reduce(v, [](double a, double b) { return a + b; });
}
__device__ __forceinline__ float warp_max(float v) {
  return warp_reduce(v, [](float a, float b) { return fmaxf(a, b); });
}

// Sum over a block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `shared` holds at least 32 values. Synchronises; safe to call repeatedly.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_reduce(v, [](T a, T b) { return a + b; });
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : T(0);
  v = warp_reduce(v, [](T a, T b) { return a + b; });
  return v;
}

template <class T>
__device__ __forceinline__ T block_max(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_reduce(v, [](T a, T b) { return a > b ? a : b; });
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : shared[0];
  v = warp_reduce(v, [](T a, T b) { return a > b ? a : b; });
  return v;
}

// 16-byte aligned vector of N elements of T.
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Elements of T per 16-byte pack (Vec<T, 16 / sizeof(T)>) when `inner`, the contiguous run a pack must
// not cross (a row, the channels of a pixel), is a multiple of it and every given pointer is 16-byte
// aligned (null pointers, unused operands, are skipped); else 1.
template <class T>
int pack_width(std::int64_t inner, std::initializer_list<const void*> pointers) {
  constexpr int n = static_cast<int>(16 / sizeof(T));
  if (inner % n != 0) return 1;
  for (const void* p : pointers)
    if (p && !aligned16(p)) return 1;
  return n;
}

}  // namespace kiln::ops::cuda
