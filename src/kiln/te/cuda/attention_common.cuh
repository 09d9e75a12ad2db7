#pragma once
// Shared pieces of the CUDA attention kernels (te/cuda/attention_*.cu): the kernels' view of the
// sizes, element conversions, warp reductions, and the choice between the tensor-core path
// (bfloat16 / float16, head dims 64 and 128) and the SIMT path (every dtype, any head dim <= 256).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <type_traits>

#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/vendor/cuda.h"
#include "kiln/te/attention_dropout.h"
#include "kiln/te/attention_params.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te::cuda {

// The sizes as the kernels read them (a plain struct, passed by value).
struct KernelSizes {
  std::int64_t batch, q_len, kv_len, q_heads, kv_heads, head_dim, group;
  int causal;
  double scale;
  // Attention dropout (AttentionParams): on, the keep threshold, the kept probabilities' factor,
  // and the Philox seed and stream start (plus the device counter's value when set).
  int dropout;
  std::uint32_t keep_threshold;
  double dropout_scale;
  std::uint64_t dropout_seed, dropout_offset;
  const std::int64_t* dropout_offset_device;

  static KernelSizes of(const AttentionParams& p) {
    return {p.batch,
            p.q_len,
            p.kv_len,
            p.q_heads,
            p.kv_heads,
            p.head_dim,
            p.group(),
            p.causal ? 1 : 0,
            p.scale,
            p.has_dropout() ? 1 : 0,
            p.dropout_threshold(),
            p.has_dropout() ? p.dropout_scale() : 1.0,
            p.dropout_seed,
            p.dropout_offset,
            p.dropout_offset_device};
  }
  // The mask's stream start, read once per thread when the kernel runs (the graph-safe counter is
  // written by kernels before this one in stream order).
  __device__ std::uint64_t dropout_base() const {
    return dropout_offset + (dropout_offset_device != nullptr ? static_cast<std::uint64_t>(*dropout_offset_device) : 0);
  }
  // Whether probability (b, h, i, j) is kept (attention_dropout.h: the CPU kernel's mask, bit for bit).
  __device__ bool keep(std::uint64_t base, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return attention_dropout_keep(dropout_seed, attention_dropout_counter(base, b, h, i, j, q_heads, q_len, kv_len),
                                  keep_threshold);
  }
  // The last key query row i sees (bottom-right causal alignment); below 0: none.
  __host__ __device__ std::int64_t last_key(std::int64_t i) const { return causal ? i + kv_len - q_len : kv_len - 1; }
  // Element offset of row `pos` of head `h` of batch `b` in a [B, len, heads, D] tensor.
  __host__ __device__ std::int64_t row(std::int64_t b, std::int64_t pos, std::int64_t len, std::int64_t heads,
                                       std::int64_t h) const {
    return ((b * len + pos) * heads + h) * head_dim;
  }
};

// Loads and stores between the stored types (__nv_bfloat16, __half, float, double) and the
// accumulation type (float, or double for double).
template <class A, class T>
__device__ __forceinline__ A load_acc(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return static_cast<A>(__bfloat162float(v));
  else if constexpr (std::is_same_v<T, __half>)
    return static_cast<A>(__half2float(v));
  else
    return static_cast<A>(v);
}
template <class T, class A>
__device__ __forceinline__ T store_from(A v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

template <class A>
__device__ __forceinline__ A exp_acc(A x) {
  if constexpr (std::is_same_v<A, double>)
    return exp(x);
  else
    return expf(x);
}
template <class A>
__device__ __forceinline__ A log_acc(A x) {
  if constexpr (std::is_same_v<A, double>)
    return log(x);
  else
    return logf(x);
}
template <class A>
__device__ __forceinline__ A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class A>
__device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Whether the tensor-core kernels take this call: 16-bit inputs, head dim 64 or 128, and rows
// aligned for 16-byte vector loads (a view at an odd storage offset falls back to SIMT).
// KILN_ATTENTION_SIMT=1 forces the SIMT kernels (read on every call, so a test can compare the
// two paths on one device).
inline bool tensor_core_path(const Tensor& q, const AttentionParams& p, std::initializer_list<const Tensor*> all) {
  if (q.dtype() != DType::BF16 && q.dtype() != DType::F16) return false;
  if (const char* force = std::getenv("KILN_ATTENTION_SIMT"); force != nullptr && force[0] == '1') return false;
  if (p.head_dim != 64 && p.head_dim != 128) return false;
  for (const Tensor* t : all)
    if (reinterpret_cast<std::uintptr_t>(t->data_ptr()) % 16 != 0) return false;
  return true;
}

// Calls fn.template operator()<T>() with T the CUDA type of a floating dtype.
template <class Fn>
void dispatch_cuda_type(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::F64: fn.template operator()<double>(); break;
    case DType::F32: fn.template operator()<float>(); break;
    case DType::BF16: fn.template operator()<__nv_bfloat16>(); break;
    case DType::F16: fn.template operator()<__half>(); break;
    default: KILN_FAIL("{}: dtype {} is not supported on CUDA", op, dtype_name(t));
  }
}

constexpr int kSimtWarps = 4;     // query (or key) rows per SIMT block, one warp each
constexpr int kMaxHeadDim = 256;  // 8 output elements per lane
constexpr int kTcRows = 64;       // query rows (forward) / key rows (backward) per tensor-core block
constexpr int kTcCols = 64;       // key columns (forward) / query columns (backward) per tile
constexpr int kTcWarps = 4;       // 16 rows each
constexpr int kPad16 = 8;         // shared-memory row padding of 16-bit tiles (elements): breaks bank conflicts
constexpr int kPadF32 = 4;        // the same for float tiles
constexpr float kLog2e = 1.4426950408889634f;

// Shared-memory carving: successive regions, each 128-byte aligned (WMMA needs 32).
struct SmemCursor {
  std::size_t offset = 0;
  template <class E>
  __host__ __device__ std::size_t take(std::size_t count) {
    const std::size_t at = offset;
    offset = (offset + count * sizeof(E) + 127) / 128 * 128;
    return at;
  }
};

}  // namespace kiln::te::cuda

namespace kiln::te::cuda {
// Lets `kernel` use `bytes` of dynamic shared memory on cuda:index (above the 48 KiB default; the
// attribute is per device), once per device: `done` is the caller's own (one per kernel
// instantiation) bit set of devices already configured.
template <class Kernel>
void allow_dynamic_smem(Kernel* kernel, std::size_t bytes, int index, std::atomic<std::uint64_t>& done) {
  const std::uint64_t bit = std::uint64_t{1} << (index & 63);
  if (done.load(std::memory_order_acquire) & bit) return;
  KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  done.fetch_or(bit, std::memory_order_acq_rel);
}

// Whether cuda:index runs the 16-bit WMMA kernels (compute capability 8.0 or newer); asked once
// per device.
inline bool device_has_bf16_tensor_cores(int index) {
  static std::atomic<int> major[64] = {};
  if (index < 0 || index >= 64) return false;
  int known = major[index].load(std::memory_order_relaxed);
  if (known == 0) {
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&known, cudaDevAttrComputeCapabilityMajor, index));
    major[index].store(known, std::memory_order_relaxed);
  }
  return known >= 8;
}
}  // namespace kiln::te::cuda

namespace kiln::te::cuda {

// A 64-row tile of a [B, len, heads, D] tensor (16-bit elements) staged in registers: load()
// issues the global reads (16 bytes per thread per step; rows past `len` are zeros), store() puts
// them into shared memory with row stride ld. Loading the next tile before computing on the
// current one and storing it after keeps the global reads in flight during the math (FlashAttention
// does this with cp.async; registers need no second shared-memory buffer).
template <class T, int D>
struct TileRegs {
  static constexpr int kThreads = kTcWarps * 32;
  static constexpr int kVec = 8;  // 16-bit elements per 16 bytes
  static constexpr int kPer = 64 * (D / kVec) / kThreads;
  static_assert(64 * (D / kVec) % kThreads == 0, "whole steps per thread");
  uint4 r[kPer];

  __device__ __forceinline__ void load(const T* src, const KernelSizes& p, std::int64_t b, std::int64_t first,
                                       std::int64_t len, std::int64_t heads, std::int64_t h) {
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int idx = static_cast<int>(threadIdx.x) + u * kThreads;
      const int row = idx / (D / kVec), c = (idx % (D / kVec)) * kVec;
      r[u] = first + row < len ? *reinterpret_cast<const uint4*>(src + p.row(b, first + row, len, heads, h) + c)
                               : make_uint4(0, 0, 0, 0);
    }
  }
  __device__ __forceinline__ void store(T* dst, int ld) const {
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int idx = static_cast<int>(threadIdx.x) + u * kThreads;
      const int row = idx / (D / kVec), c = (idx % (D / kVec)) * kVec;
      *reinterpret_cast<uint4*>(dst + row * ld + c) = r[u];
    }
  }
};

// A 64-row tile straight into shared memory (tiles read once per block).
template <class T, int D>
__device__ __forceinline__ void load_tile(T* dst, int ld, const T* src, const KernelSizes& p, std::int64_t b,
                                          std::int64_t first, std::int64_t len, std::int64_t heads, std::int64_t h) {
  TileRegs<T, D> t;
  t.load(src, p, b, first, len, heads, h);
  t.store(dst, ld);
}

}  // namespace kiln::te::cuda

namespace kiln::te::cuda {
// The mma.sync forward (te/cuda/attention_forward_mma.cu): bfloat16 / float16, head dim 64 or 128,
// the same contract as the WMMA one. The default Kiln forward since it passed its tests on the H200
// at twice the WMMA kernel's speed; KILN_ATTENTION_MMA=0 selects the WMMA kernel (read on every call).
void launch_forward_mma(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const KernelSizes& p, cudaStream_t stream);
inline bool mma_forward_selected() {
  const char* on = std::getenv("KILN_ATTENTION_MMA");
  return on == nullptr || on[0] != '0';
}
}  // namespace kiln::te::cuda
