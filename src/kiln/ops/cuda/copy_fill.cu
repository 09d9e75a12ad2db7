// CUDA copy (strided, with dtype conversion), fill, arange and random (Philox, bit-identical to
// the CPU kernels). Same-dtype contiguous copies are cudaMemcpyAsync; the common float
// conversions have a vectorised contiguous path; same-dtype (batched) 2-D transposes go through
// shared-memory tiles (transpose_copy.h; opt-in for now); everything else goes through one general N-d
// kernel that converts with a runtime dtype switch (uniform per launch, so it costs little and
// avoids instantiating every dtype pair).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/cuda_kernels.h"
#include "kiln/ops/cuda/transpose_copy.h"
#include "kiln/ops/philox.h"

namespace kiln::ops::cuda {

const DeviceInfo& device_info(int index) {
  static DeviceInfo infos[64];
  static std::once_flag once[64];
  // Every launch sizes its grid with this: after the first query a plain acquire load answers,
  // where std::call_once would call into libstdc++ and pthread_once each time.
  static std::atomic<bool> ready[64];
  if (index >= 0 && index < 64 && ready[index].load(std::memory_order_acquire)) return infos[index];
  KILN_CHECK(index >= 0 && index < 64, "cuda: device index {} out of range", index);
  std::call_once(once[index], [index] {
    int v = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, index));
    infos[index].sms = v;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxThreadsPerMultiProcessor, index));
    infos[index].max_threads_per_sm = v;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, index));
    infos[index].shared_per_block_optin = static_cast<std::size_t>(v);
    ready[index].store(true, std::memory_order_release);
  });
  return infos[index];
}

namespace {

// A value in flight between two dtypes: integers stay integers (no rounding through double).
struct Value {
  double d;
  std::int64_t i;
  bool is_int;
};

__device__ __forceinline__ Value load_value(const void* base, std::int64_t off, DType t) {
  switch (t) {
    case DType::F64: return {static_cast<const double*>(base)[off], 0, false};
    case DType::F32: return {static_cast<const float*>(base)[off], 0, false};
    case DType::BF16: return {to_float(static_cast<const BFloat16*>(base)[off]), 0, false};
    case DType::F16: return {to_float(static_cast<const Half*>(base)[off]), 0, false};
    case DType::F8E4M3: return {static_cast<float>(static_cast<const Float8E4M3*>(base)[off]), 0, false};
    case DType::F8E5M2: return {static_cast<float>(static_cast<const Float8E5M2*>(base)[off]), 0, false};
    case DType::I64: return {0, static_cast<const std::int64_t*>(base)[off], true};
    case DType::I32: return {0, static_cast<const std::int32_t*>(base)[off], true};
    case DType::U8: return {0, static_cast<const std::uint8_t*>(base)[off], true};
    case DType::Bool: return {0, static_cast<const bool*>(base)[off] ? 1 : 0, true};
  }
  return {0, 0, false};
}

template <class D>
__device__ __forceinline__ D convert_value(Value v) {
  if constexpr (std::is_same_v<D, bool>) {
    return v.is_int ? v.i != 0 : static_cast<float>(v.d) != 0.0f;
  } else if constexpr (std::is_integral_v<D>) {
    return v.is_int ? static_cast<D>(v.i) : static_cast<D>(v.d);
  } else if constexpr (std::is_same_v<D, double>) {
    return v.is_int ? static_cast<double>(v.i) : v.d;
  } else if constexpr (std::is_same_v<D, float>) {
    return v.is_int ? static_cast<float>(v.i) : static_cast<float>(v.d);
  } else {
    float f = v.is_int ? static_cast<float>(v.i) : static_cast<float>(v.d);
    return store_as<D>(f);
  }
}

__device__ __forceinline__ void store_value(void* base, std::int64_t off, DType t, Value v) {
  switch (t) {
    case DType::F64: static_cast<double*>(base)[off] = convert_value<double>(v); break;
    case DType::F32: static_cast<float*>(base)[off] = convert_value<float>(v); break;
    case DType::BF16: static_cast<BFloat16*>(base)[off] = convert_value<BFloat16>(v); break;
    case DType::F16: static_cast<Half*>(base)[off] = convert_value<Half>(v); break;
    case DType::F8E4M3: static_cast<Float8E4M3*>(base)[off] = convert_value<Float8E4M3>(v); break;
    case DType::F8E5M2: static_cast<Float8E5M2*>(base)[off] = convert_value<Float8E5M2>(v); break;
    case DType::I64: static_cast<std::int64_t*>(base)[off] = convert_value<std::int64_t>(v); break;
    case DType::I32: static_cast<std::int32_t*>(base)[off] = convert_value<std::int32_t>(v); break;
    case DType::U8: static_cast<std::uint8_t*>(base)[off] = convert_value<std::uint8_t>(v); break;
    case DType::Bool: static_cast<bool*>(base)[off] = convert_value<bool>(v); break;
  }
}

__global__ void __launch_bounds__(256)
    copy_general_kernel(Indexer<2> ix, std::int64_t n, const void* src, DType st, void* dst, DType dt) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    std::int64_t off[2];
    ix.offsets(i, off);
    store_value(dst, off[0], dt, load_value(src, off[1], st));
  }
}

// Same dtype, strided: move raw elements of `Bytes` size.
template <class U>
__global__ void __launch_bounds__(256) copy_strided_same_kernel(Indexer<2> ix, std::int64_t n, const U* src, U* dst) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    std::int64_t off[2];
    ix.offsets(i, off);
    dst[off[0]] = src[off[1]];
  }
}

// Contiguous conversion S -> D, 4 elements per thread step, vector loads when aligned.
template <class S, class D>
__global__ void __launch_bounds__(256)
    convert_contig_kernel(std::int64_t n, const S* __restrict__ src, D* __restrict__ dst) {
  const std::int64_t stride = std::int64_t{blockDim.x} * gridDim.x;
  const std::int64_t n4 = n / 4;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n4; i += stride) {
    Vec<S, 4> in = reinterpret_cast<const Vec<S, 4>*>(src)[i];
    Vec<D, 4> out;
#pragma unroll
    for (int j = 0; j < 4; ++j) out.v[j] = store_as<D>(load_as<float>(in.v[j]));
    reinterpret_cast<Vec<D, 4>*>(dst)[i] = out;
  }
  for (std::int64_t i = n4 * 4 + blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += stride)
    dst[i] = store_as<D>(load_as<float>(src[i]));
}

template <class S, class D>
void launch_convert(const Launch& l, std::int64_t n, const void* src, void* dst) {
  convert_contig_kernel<S, D>
      <<<grid_for(n / 4 + 1, 256, l.index), 256, 0, l.stream>>>(n, static_cast<const S*>(src), static_cast<D*>(dst));
  KILN_CUDA_CHECK_LAUNCH();
}

template <class U>
void launch_strided_same(const Launch& l, const Indexer<2>& ix, std::int64_t n, const void* src, void* dst) {
  copy_strided_same_kernel<U>
      <<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(ix, n, static_cast<const U*>(src), static_cast<U*>(dst));
  KILN_CUDA_CHECK_LAUNCH();
}

// acc[i] += src[i], contiguous, float32 accumulator, 4 elements per thread step (vector loads).
template <class S>
__global__ void __launch_bounds__(256)
    accumulate_contig_kernel(std::int64_t n, const S* __restrict__ src, float* __restrict__ acc) {
  const std::int64_t stride = std::int64_t{blockDim.x} * gridDim.x;
  const std::int64_t n4 = n / 4;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n4; i += stride) {
    Vec<S, 4> in = reinterpret_cast<const Vec<S, 4>*>(src)[i];
    Vec<float, 4> a = reinterpret_cast<const Vec<float, 4>*>(acc)[i];
#pragma unroll
    for (int j = 0; j < 4; ++j) a.v[j] += load_as<float>(in.v[j]);
    reinterpret_cast<Vec<float, 4>*>(acc)[i] = a;
  }
  for (std::int64_t i = n4 * 4 + blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += stride)
    acc[i] += load_as<float>(src[i]);
}

// Any strides and floating dtypes: added in the accumulator's precision (float32 or float64).
__global__ void __launch_bounds__(256)
    accumulate_general_kernel(Indexer<2> ix, std::int64_t n, const void* src, DType st, void* acc, DType at) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    std::int64_t off[2];
    ix.offsets(i, off);
    if (at == DType::F64)
      static_cast<double*>(acc)[off[0]] += convert_value<double>(load_value(src, off[1], st));
    else
      static_cast<float*>(acc)[off[0]] += convert_value<float>(load_value(src, off[1], st));
  }
}

template <class T>
__global__ void __launch_bounds__(256) fill_kernel(Indexer<1> ix, std::int64_t n, T* dst, T value) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    std::int64_t off[1];
    ix.offsets(i, off);
    dst[off[0]] = value;
  }
}

template <class T>
__global__ void __launch_bounds__(256) fill_contig_kernel(std::int64_t n, T* dst, T value) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x)
    dst[i] = value;
}

template <class U>
void launch_fill(const Launch& l, const Tensor& dst, U bits) {
  const std::int64_t n = dst.numel();
  auto ix = make_indexer<1>(dst.shape(), {&dst.strides()});
  if (is_flat(ix)) {
    fill_contig_kernel<U><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(n, static_cast<U*>(dst.data_ptr()), bits);
  } else {
    fill_kernel<U><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(ix, n, static_cast<U*>(dst.data_ptr()), bits);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

template <class D>
__global__ void __launch_bounds__(256) arange_kernel(std::int64_t n, D* dst, double start, double step) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    double v = __dadd_rn(start, __dmul_rn(step, static_cast<double>(i)));  // as the CPU: no FMA
    dst[i] = convert_value<D>(Value{v, 0, false});
  }
}

template <class D>
__global__ void __launch_bounds__(256)
    random_kernel(std::int64_t n, D* dst, RandomKind kind, std::uint64_t seed, std::uint64_t offset,
                  const std::int64_t* offset_ptr, double a, double b) {
  if (offset_ptr) offset += static_cast<std::uint64_t>(*offset_ptr);  // read when the kernel runs
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    std::uint64_t idx = offset + static_cast<std::uint64_t>(i);
    float v = 0;
    switch (kind) {
      case RandomKind::Uniform:
        v = static_cast<float>(
            __dadd_rn(a, __dmul_rn(__dadd_rn(b, -a), static_cast<double>(random_uniform(seed, idx)))));
        break;
      case RandomKind::Normal:
        v = static_cast<float>(__dadd_rn(a, __dmul_rn(b, static_cast<double>(random_normal(seed, idx)))));
        break;
      case RandomKind::Bernoulli: v = static_cast<double>(random_uniform(seed, idx)) < a ? 1.0f : 0.0f; break;
    }
    if constexpr (std::is_same_v<D, float>)
      dst[i] = v;
    else if constexpr (std::is_same_v<D, double>)
      dst[i] = static_cast<double>(v);
    else
      dst[i] = D(v);  // the host type's own rounding: identical to the CPU kernel
  }
}

// The tiled transpose is opt-in (KILN_CUDA_TILED_TRANSPOSE=1) until its tests and its speed have
// run on a GPU (docs/PERF.md); the variable is read only for copies that are transposes.
bool tiled_transpose_enabled() {
  const char* env = std::getenv("KILN_CUDA_TILED_TRANSPOSE");
  return env != nullptr && std::strcmp(env, "1") == 0;
}

// The copy as a batched 2-D transpose, when it is one: the destination contiguous, the source
// contiguous along the destination's second-to-last (merged) dimension and strided along its last.
// A leading batch dimension may have any source stride.
std::optional<BatchedTranspose> as_batched_transpose(const Indexer<2>& ix) {
  const int n = ix.ndim;
  if (n < 2 || n > 3) return std::nullopt;
  const std::int64_t rows = ix.sizes[n - 2], cols = ix.sizes[n - 1];
  const auto& d = ix.strides[0];
  const auto& s = ix.strides[1];
  if (d[n - 1] != 1 || d[n - 2] != cols || (n == 3 && d[0] != rows * cols)) return std::nullopt;
  if (s[n - 2] != 1 || s[n - 1] < rows) return std::nullopt;
  BatchedTranspose t;
  t.batch = n == 3 ? ix.sizes[0] : 1;
  t.rows = rows;
  t.cols = cols;
  t.src_ld = s[n - 1];
  t.src_batch_stride = n == 3 ? s[0] : 0;
  return t;
}

}  // namespace

void copy(const Tensor& src, const Tensor& dst) {
  const std::int64_t n = dst.numel();
  if (n == 0) return;
  Launch l(dst);
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    if (src.data_ptr() != dst.data_ptr())
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToDevice, l.stream));
    return;
  }
  auto ix = make_indexer<2>(dst.shape(), {&dst.strides(), &src.strides()});
  const void* s = src.data_ptr();
  void* d = dst.data_ptr();
  if (is_flat(ix)) {
    const DType a = src.dtype(), b = dst.dtype();
    bool aligned = aligned16(s) && aligned16(d);
    if (aligned) {
      if (a == DType::F32 && b == DType::BF16) return launch_convert<float, BFloat16>(l, n, s, d);
      if (a == DType::BF16 && b == DType::F32) return launch_convert<BFloat16, float>(l, n, s, d);
      if (a == DType::F32 && b == DType::F16) return launch_convert<float, Half>(l, n, s, d);
      if (a == DType::F16 && b == DType::F32) return launch_convert<Half, float>(l, n, s, d);
    }
  }
  if (src.dtype() == dst.dtype()) {
    if (const auto t = as_batched_transpose(ix); t && dtype_size(dst.dtype()) <= 8 && tiled_transpose_enabled())
      return launch_batched_transpose(*t, static_cast<int>(dtype_size(dst.dtype())), s, d, l.stream, l.index);
    switch (dtype_size(dst.dtype())) {
      case 1: return launch_strided_same<std::uint8_t>(l, ix, n, s, d);
      case 2: return launch_strided_same<std::uint16_t>(l, ix, n, s, d);
      case 4: return launch_strided_same<std::uint32_t>(l, ix, n, s, d);
      case 8: return launch_strided_same<std::uint64_t>(l, ix, n, s, d);
      default: break;
    }
  }
  copy_general_kernel<<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(ix, n, s, src.dtype(), d, dst.dtype());
  KILN_CUDA_CHECK_LAUNCH();
}

void accumulate(const Tensor& acc, const Tensor& src) {
  KILN_CHECK(acc.dtype() == DType::F32 || acc.dtype() == DType::F64,
             "accumulate: the accumulator must be float32 or float64, got {}", acc.describe());
  KILN_CHECK(is_floating(src.dtype()), "accumulate: the addend must be floating point, got {}", src.describe());
  const std::int64_t n = acc.numel();
  if (n == 0) return;
  Launch l(acc);
  const void* s = src.data_ptr();
  void* a = acc.data_ptr();
  if (acc.dtype() == DType::F32 && acc.is_contiguous() && src.is_contiguous() && aligned16(s) && aligned16(a)) {
    const unsigned grid = grid_for(n / 4 + 1, 256, l.index);
    switch (src.dtype()) {
      case DType::BF16:
        accumulate_contig_kernel<BFloat16>
            <<<grid, 256, 0, l.stream>>>(n, static_cast<const BFloat16*>(s), static_cast<float*>(a));
        KILN_CUDA_CHECK_LAUNCH();
        return;
      case DType::F16:
        accumulate_contig_kernel<Half>
            <<<grid, 256, 0, l.stream>>>(n, static_cast<const Half*>(s), static_cast<float*>(a));
        KILN_CUDA_CHECK_LAUNCH();
        return;
      case DType::F32:
        accumulate_contig_kernel<float>
            <<<grid, 256, 0, l.stream>>>(n, static_cast<const float*>(s), static_cast<float*>(a));
        KILN_CUDA_CHECK_LAUNCH();
        return;
      default: break;
    }
  }
  auto ix = make_indexer<2>(acc.shape(), {&acc.strides(), &src.strides()});
  accumulate_general_kernel<<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(ix, n, s, src.dtype(), a, acc.dtype());
  KILN_CUDA_CHECK_LAUNCH();
}

void fill(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  Launch l(dst);
  // Convert on the host exactly as the CPU kernel does, then fill raw bits.
  KILN_DISPATCH_ALL(dst.dtype(), "fill", [&]<class D>() {
    D v;
    if constexpr (std::is_same_v<D, bool>)
      v = static_cast<float>(value) != 0.0f;
    else if constexpr (std::is_arithmetic_v<D>)
      v = static_cast<D>(value);
    else
      v = D(static_cast<float>(value));
    if constexpr (sizeof(D) == 1) {
      std::uint8_t bits;
      std::memcpy(&bits, &v, 1);
      launch_fill<std::uint8_t>(l, dst, bits);
    } else if constexpr (sizeof(D) == 2) {
      std::uint16_t bits;
      std::memcpy(&bits, &v, 2);
      launch_fill<std::uint16_t>(l, dst, bits);
    } else if constexpr (sizeof(D) == 4) {
      std::uint32_t bits;
      std::memcpy(&bits, &v, 4);
      launch_fill<std::uint32_t>(l, dst, bits);
    } else {
      std::uint64_t bits;
      std::memcpy(&bits, &v, 8);
      launch_fill<std::uint64_t>(l, dst, bits);
    }
  });
}

void arange(const Tensor& dst, double start, double step) {
  const std::int64_t n = dst.numel();
  if (n == 0) return;
  Launch l(dst);
  KILN_DISPATCH_NUMERIC(dst.dtype(), "arange", [&]<class D>() {
    arange_kernel<D><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(n, static_cast<D*>(dst.data_ptr()), start, step);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void random(const Tensor& dst, RandomKind kind, std::uint64_t seed, std::uint64_t offset, double a, double b) {
  const std::int64_t n = dst.numel();
  if (n == 0) return;
  KILN_CHECK(dst.is_contiguous(), "random: expected a contiguous tensor, got {}", dst.describe());
  Launch l(dst);
  KILN_DISPATCH_FLOATING(dst.dtype(), "random", [&]<class D>() {
    random_kernel<D><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(n, static_cast<D*>(dst.data_ptr()), kind, seed,
                                                                      offset, nullptr, a, b);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void random_device_offset(const Tensor& dst, RandomKind kind, std::uint64_t seed, const Tensor& offset, double a,
                          double b) {
  const std::int64_t n = dst.numel();
  if (n == 0) return;
  KILN_CHECK(dst.is_contiguous(), "random_device_offset: expected a contiguous tensor, got {}", dst.describe());
  KILN_CHECK(offset.dtype() == DType::I64 && offset.numel() == 1 && offset.device() == dst.device(),
             "random_device_offset: offset must be an int64 scalar on {}, got {}", dst.device().str(),
             offset.describe());
  Launch l(dst);
  const auto* offset_ptr = static_cast<const std::int64_t*>(offset.data_ptr());
  KILN_DISPATCH_FLOATING(dst.dtype(), "random_device_offset", [&]<class D>() {
    random_kernel<D><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(n, static_cast<D*>(dst.data_ptr()), kind, seed, 0,
                                                                      offset_ptr, a, b);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace kiln::ops::cuda
