// CUDA index_select, index_add (atomics), gather, scatter_add (atomics) and topk.
// The indexed dimension's stride is zeroed in the Indexer and the index value times the real
// stride is added, so strided inputs work without copies. topk: rows up to 4096 wide are
// bitonic-sorted in shared memory; wider rows use k rounds of a block arg-max (k <= 256).
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/cuda_kernels.h"

namespace kiln::ops::cuda {

namespace {

std::int64_t inner_size(const Shape& s, int dim) {
  std::int64_t n = 1;
  for (std::size_t d = static_cast<std::size_t>(dim) + 1; d < s.size(); ++d) n *= s[d];
  return n;
}

Strides zero_dim(const Strides& s, int dim) {
  Strides out = s;
  out[dim] = 0;
  return out;
}

template <class T>
__device__ __forceinline__ void atomic_add(T* p, T v) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    atomicAdd(p, v);
  } else if constexpr (std::is_same_v<T, Half>) {
    atomicAdd(reinterpret_cast<__half*>(p), __float2half_rn(to_float(v)));
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    atomicAdd(reinterpret_cast<__nv_bfloat16*>(p), __float2bfloat16_rn(to_float(v)));
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    atomicAdd(reinterpret_cast<int*>(p), static_cast<int>(v));
  }
}

// out[i] = in[off_in(i) + index[j(i)] * in_stride_dim]; j = coordinate of i along dim.
template <class U>
__global__ void __launch_bounds__(256) index_select_kernel(Indexer<2> ix, std::int64_t n, std::int64_t inner,
                                                           std::int64_t len, const U* in, std::int64_t in_stride,
                                                           const std::int64_t* index, U* out) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    std::int64_t off[2];
    ix.offsets(i, off);
    const std::int64_t j = (i / inner) % len;
    out[off[0]] = in[off[1] + index[j] * in_stride];
  }
}

// out[... index[j] ...] += src[... j ...]
template <class T>
__global__ void __launch_bounds__(256) index_add_kernel(Indexer<2> ix, std::int64_t n, std::int64_t inner,
                                                        std::int64_t len, const T* src, const std::int64_t* index,
                                                        T* out, std::int64_t out_stride) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    std::int64_t off[2];
    ix.offsets(i, off);
    const std::int64_t j = (i / inner) % len;
    atomic_add(out + off[1] + index[j] * out_stride, src[off[0]]);
  }
}

// gather: tensors (out, index, in with dim stride 0).
template <class U>
__global__ void __launch_bounds__(256) gather_kernel(Indexer<3> ix, std::int64_t n, const U* in, std::int64_t in_stride,
                                                     const std::int64_t* index, U* out) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    std::int64_t off[3];
    ix.offsets(i, off);
    out[off[0]] = in[off[2] + index[off[1]] * in_stride];
  }
}

// scatter_add: tensors (index, src, out with dim stride 0).
template <class T>
__global__ void __launch_bounds__(256) scatter_add_kernel(Indexer<3> ix, std::int64_t n, const std::int64_t* index,
                                                          const T* src, T* out, std::int64_t out_stride) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    std::int64_t off[3];
    ix.offsets(i, off);
    atomic_add(out + off[2] + index[off[0]] * out_stride, src[off[1]]);
  }
}

template <class U>
void launch_index_select(const Launch& l, const Tensor& in, int dim, const Tensor& index, const Tensor& out) {
  const std::int64_t n = out.numel();
  Strides in_s = zero_dim(in.strides(), dim);
  auto ix = make_indexer<2>(out.shape(), {&out.strides(), &in_s});
  index_select_kernel<U><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(
      ix, n, inner_size(out.shape(), dim), out.shape()[dim], static_cast<const U*>(in.data_ptr()), in.strides()[dim],
      static_cast<const std::int64_t*>(index.data_ptr()), static_cast<U*>(out.data_ptr()));
  KILN_CUDA_CHECK_LAUNCH();
}

template <class U>
void launch_gather(const Launch& l, const Tensor& in, int dim, const Tensor& index, const Tensor& out) {
  const std::int64_t n = out.numel();
  Strides in_s = zero_dim(in.strides(), dim);
  Strides in_full(out.dim());
  for (std::size_t d = 0; d < in_full.size(); ++d) in_full[d] = in_s[d];
  auto ix = make_indexer<3>(out.shape(), {&out.strides(), &index.strides(), &in_full});
  gather_kernel<U><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(ix, n, static_cast<const U*>(in.data_ptr()),
                                                                     in.strides()[dim],
                                                                     static_cast<const std::int64_t*>(index.data_ptr()),
                                                                     static_cast<U*>(out.data_ptr()));
  KILN_CUDA_CHECK_LAUNCH();
}

// ---- topk ---------------------------------------------------------------------------------------

template <class A>
struct Pair {
  A v;
  int i;  // -1: padding, worse than everything
};

// Strict "a comes before b" in the output order (largest: NaN first, then descending; ties by index).
template <class A>
__device__ __forceinline__ bool before(const Pair<A>& a, const Pair<A>& b, bool largest) {
  if (a.i < 0) return false;
  if (b.i < 0) return true;
  const bool an = a.v != a.v, bn = b.v != b.v;
  if (an != bn) return largest ? an : bn;
  if (!an && a.v != b.v) return largest ? a.v > b.v : a.v < b.v;
  return a.i < b.i;
}

template <class T>
__global__ void __launch_bounds__(512) topk_bitonic_kernel(const T* __restrict__ in, std::int64_t d, int n2,
                                                           std::int64_t k, bool largest, T* __restrict__ values,
                                                           std::int64_t* __restrict__ indices) {
  using A = acc_t<T>;
  extern __shared__ unsigned char smem_raw[];
  Pair<A>* s = reinterpret_cast<Pair<A>*>(smem_raw);
  const std::int64_t row = blockIdx.x;
  const T* x = in + row * d;
  for (int i = threadIdx.x; i < n2; i += blockDim.x) s[i] = i < d ? Pair<A>{load_as<A>(x[i]), i} : Pair<A>{A(0), -1};
  __syncthreads();
  // Sort so that s[0] comes first in the output order.
  for (int size = 2; size <= n2; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n2; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool up = (i & size) == 0;
          Pair<A> a = s[i], b = s[j];
          const bool swap = up ? before(b, a, largest) : before(a, b, largest);
          if (swap) {
            s[i] = b;
            s[j] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  for (std::int64_t i = threadIdx.x; i < k; i += blockDim.x) {
    values[row * k + i] = store_as<T>(s[i].v);
    indices[row * k + i] = s[i].i;
  }
}

// Wide rows: k rounds; round r picks the best element that comes after the previous pick.
template <class T>
__global__ void __launch_bounds__(512) topk_select_kernel(const T* __restrict__ in, std::int64_t d, std::int64_t k,
                                                          bool largest, T* __restrict__ values,
                                                          std::int64_t* __restrict__ indices) {
  using A = acc_t<T>;
  __shared__ Pair<A> sh[512];
  const std::int64_t row = blockIdx.x;
  const T* x = in + row * d;
  Pair<A> prev{A(0), -1};
  for (std::int64_t r = 0; r < k; ++r) {
    Pair<A> best{A(0), -1};
    for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      Pair<A> c{load_as<A>(x[i]), static_cast<int>(i)};
      if (r > 0 && !before(prev, c, largest)) continue;
      if (before(c, best, largest)) best = c;
    }
    sh[threadIdx.x] = best;
    __syncthreads();
    for (int off = blockDim.x / 2; off > 0; off >>= 1) {
      if (threadIdx.x < off && before(sh[threadIdx.x + off], sh[threadIdx.x], largest))
        sh[threadIdx.x] = sh[threadIdx.x + off];
      __syncthreads();
    }
    prev = sh[0];
    __syncthreads();
    if (threadIdx.x == 0) {
      values[row * k + r] = store_as<T>(prev.v);
      indices[row * k + r] = prev.i;
    }
  }
}

}  // namespace

void index_select(const Tensor& in, int dim, const Tensor& index, const Tensor& out) {
  if (out.numel() == 0) return;
  Launch l(out);
  switch (dtype_size(out.dtype())) {
    case 1: return launch_index_select<std::uint8_t>(l, in, dim, index, out);
    case 2: return launch_index_select<std::uint16_t>(l, in, dim, index, out);
    case 4: return launch_index_select<std::uint32_t>(l, in, dim, index, out);
    default: return launch_index_select<std::uint64_t>(l, in, dim, index, out);
  }
}

void gather(const Tensor& in, int dim, const Tensor& index, const Tensor& out) {
  if (out.numel() == 0) return;
  Launch l(out);
  switch (dtype_size(out.dtype())) {
    case 1: return launch_gather<std::uint8_t>(l, in, dim, index, out);
    case 2: return launch_gather<std::uint16_t>(l, in, dim, index, out);
    case 4: return launch_gather<std::uint32_t>(l, in, dim, index, out);
    default: return launch_gather<std::uint64_t>(l, in, dim, index, out);
  }
}

void index_add(const Tensor& out, int dim, const Tensor& index, const Tensor& src) {
  const std::int64_t n = src.numel();
  if (n == 0) return;
  Launch l(out);
  Strides out_s = zero_dim(out.strides(), dim);
  auto ix = make_indexer<2>(src.shape(), {&src.strides(), &out_s});
  const std::int64_t inner = inner_size(src.shape(), dim), len = src.shape()[dim];
  auto run = [&]<class T>() {
    index_add_kernel<T><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(
        ix, n, inner, len, static_cast<const T*>(src.data_ptr()), static_cast<const std::int64_t*>(index.data_ptr()),
        static_cast<T*>(out.data_ptr()), out.strides()[dim]);
    KILN_CUDA_CHECK_LAUNCH();
  };
  switch (out.dtype()) {
    case DType::F32: return run.template operator()<float>();
    case DType::F64: return run.template operator()<double>();
    case DType::BF16: return run.template operator()<BFloat16>();
    case DType::F16: return run.template operator()<Half>();
    case DType::I64: return run.template operator()<std::int64_t>();
    case DType::I32: return run.template operator()<std::int32_t>();
    default: KILN_FAIL("index_add: dtype {} is not supported on CUDA", dtype_name(out.dtype()));
  }
}

void scatter_add(const Tensor& out, int dim, const Tensor& index, const Tensor& src) {
  const std::int64_t n = index.numel();
  if (n == 0) return;
  Launch l(out);
  Strides out_s = zero_dim(out.strides(), dim);
  Strides src_s = src.strides();
  auto ix = make_indexer<3>(index.shape(), {&index.strides(), &src_s, &out_s});
  auto run = [&]<class T>() {
    scatter_add_kernel<T><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(
        ix, n, static_cast<const std::int64_t*>(index.data_ptr()), static_cast<const T*>(src.data_ptr()),
        static_cast<T*>(out.data_ptr()), out.strides()[dim]);
    KILN_CUDA_CHECK_LAUNCH();
  };
  switch (out.dtype()) {
    case DType::F32: return run.template operator()<float>();
    case DType::F64: return run.template operator()<double>();
    case DType::BF16: return run.template operator()<BFloat16>();
    case DType::F16: return run.template operator()<Half>();
    case DType::I64: return run.template operator()<std::int64_t>();
    case DType::I32: return run.template operator()<std::int32_t>();
    default: KILN_FAIL("scatter_add: dtype {} is not supported on CUDA", dtype_name(out.dtype()));
  }
}

void topk(const Tensor& in, std::int64_t k, bool largest, const Tensor& values, const Tensor& indices) {
  const std::int64_t d = in.dim() ? in.shape().back() : 1;
  const std::int64_t rows = d ? in.numel() / d : 0;
  if (rows == 0 || k == 0) return;
  KILN_CHECK(k <= d, "topk: k = {} is larger than the dimension size {}", k, d);
  KILN_CHECK(d < (std::int64_t{1} << 31), "topk: rows of {} elements are too wide", d);
  KILN_CHECK(rows < (std::int64_t{1} << 31), "topk: too many rows ({})", rows);
  Launch l(in);
  KILN_DISPATCH_NUMERIC(in.dtype(), "topk", [&]<class T>() {
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(in.data_ptr());
    T* v = static_cast<T*>(values.data_ptr());
    auto* ip = static_cast<std::int64_t*>(indices.data_ptr());
    int n2 = 1;
    while (n2 < d) n2 <<= 1;
    const std::size_t shared = sizeof(Pair<A>) * static_cast<std::size_t>(n2);
    if (shared <= 48 * 1024) {
      const int threads = n2 >= 512 ? 512 : (n2 < 32 ? 32 : n2);
      topk_bitonic_kernel<T><<<static_cast<unsigned>(rows), threads, shared, l.stream>>>(x, d, n2, k, largest, v, ip);
    } else {
      KILN_CHECK(k <= 256, "topk: k = {} over rows of {} elements is not supported on CUDA (k <= 256)", k, d);
      topk_select_kernel<T><<<static_cast<unsigned>(rows), 512, 0, l.stream>>>(x, d, k, largest, v, ip);
    }
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace kiln::ops::cuda
