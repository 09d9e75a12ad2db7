// CUDA reductions (sum/mean/max/min/prod, variance, argmax/argmin). The input is split into kept
// ("outer") and reduced ("inner") dimensions. Two layouts:
// - row mode (reduced elements adjacent in memory, e.g. the last dim): a warp or a block per output,
//   16-byte vector loads on contiguous rows, several accumulators for memory-level parallelism;
// - column mode (kept elements adjacent, e.g. a sum over the batch): consecutive threads take
//   consecutive outputs (coalesced), threadIdx.y splits the reduced range.
// Either way, when there are too few outputs to fill the GPU, blockIdx.y splits the reduced range
// into chunks whose partial states go to a scratch buffer, combined by a finalize kernel.
// One template per reducer (scalar op chosen at run time, Welford variance, arg-max/min).
#include <cmath>
#include <limits>
#include <type_traits>

#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/cuda_kernels.h"

namespace kiln::ops::cuda {

namespace {

// ---- reducers -----------------------------------------------------------------------------------

template <class T>
struct ScalarReducer {
  using In = T;
  using A = acc_t<T>;
  using State = A;
  ReduceOp op;
  std::int64_t count;  // reduced elements, for the mean

  __device__ __forceinline__ State init() const {
    switch (op) {
      case ReduceOp::Prod: return A(1);
      case ReduceOp::Max: return -INFINITY;
      case ReduceOp::Min: return INFINITY;
      default: return A(0);
    }
  }
  __device__ __forceinline__ State load(T v, std::int64_t) const { return load_as<A>(v); }
  __device__ __forceinline__ State combine(State a, State b) const {
    switch (op) {
      case ReduceOp::Prod: return a * b;
      case ReduceOp::Max: return (a != a || a > b) ? a : b;
      case ReduceOp::Min: return (a != a || a < b) ? a : b;
      default: return a + b;
    }
  }
  template <class O>
  __device__ __forceinline__ void write(O* out, std::int64_t off, State s) const {
    if (op == ReduceOp::Mean) s = s / static_cast<A>(count);
    out[off] = store_as<O>(s);
  }
  using Out = T;
};

template <class T>
struct WelfordReducer {
  using In = T;
  using A = acc_t<T>;
  struct State {
    A mean, m2;
    std::int64_t n;
  };
  int correction;

  __device__ __forceinline__ State init() const { return {A(0), A(0), 0}; }
  __device__ __forceinline__ State load(T v, std::int64_t) const { return {load_as<A>(v), A(0), 1}; }
  __device__ __forceinline__ State combine(State a, State b) const {
    if (a.n == 0) return b;
    if (b.n == 0) return a;
    std::int64_t n = a.n + b.n;
    A delta = b.mean - a.mean;
    A fb = static_cast<A>(b.n) / static_cast<A>(n);
    return {a.mean + delta * fb, a.m2 + b.m2 + delta * delta * static_cast<A>(a.n) * fb, n};
  }
  template <class O>
  __device__ __forceinline__ void write(O* out, std::int64_t off, State s) const {
    A denom = static_cast<A>(s.n - correction);
    out[off] = store_as<O>(denom > A(0) ? s.m2 / denom : A(NAN));
  }
  using Out = T;
};

template <class T>
struct ArgReducer {
  using In = T;
  using A = acc_t<T>;
  struct State {
    A v;
    std::int64_t i;  // -1: empty
  };
  bool is_max;

  __device__ __forceinline__ State init() const { return {A(0), -1}; }
  __device__ __forceinline__ State load(T v, std::int64_t i) const { return {load_as<A>(v), i}; }
  __device__ __forceinline__ State combine(State a, State b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    bool an = a.v != a.v, bn = b.v != b.v;
    if (an || bn) {  // the first NaN wins, as on the CPU
      if (an && bn) return a.i < b.i ? a : b;
      return an ? a : b;
    }
    if (a.v == b.v) return a.i < b.i ? a : b;
    return (is_max ? a.v > b.v : a.v < b.v) ? a : b;
  }
  template <class O>
  __device__ __forceinline__ void write(O* out, std::int64_t off, State s) const {
    out[off] = s.i < 0 ? 0 : s.i;
  }
  using Out = std::int64_t;
};

// Tree reduction of `s` over groups of `group` consecutive threads (a power of two dividing
// blockDim.x); the result is valid in the group's first thread.
template <class R>
__device__ __forceinline__ typename R::State group_reduce(const R& r, typename R::State s, typename R::State* smem,
                                                          int group) {
  const int tid = threadIdx.x + threadIdx.y * blockDim.x;
  const int lane = tid & (group - 1);
  for (int off = group / 2; off > 0; off >>= 1) {
    smem[tid] = s;
    __syncthreads();
    if (lane < off) s = r.combine(s, smem[tid + off]);
    __syncthreads();
  }
  return s;
}

struct Plan {
  Indexer<2> outer;  // kept dims: (out strides, in strides)
  Indexer<1> inner;  // reduced dims: in strides
  std::int64_t n_out = 1, n_red = 1;
  int splits = 1;                // chunks of the reduced range (blockIdx.y)
  std::int64_t chunk = 0;        // reduced elements per chunk
  bool contiguous_rows = false;  // inner is one dim of stride 1
};

// Row mode: `group` threads per output; a block holds blockDim.x / group outputs.
template <class R, int kVec>
__global__ void __launch_bounds__(256) reduce_row_kernel(R r, Plan plan, const typename R::In* __restrict__ in,
                                                         typename R::Out* out, typename R::State* partial, int group) {
  using State = typename R::State;
  using T = typename R::In;
  __shared__ State smem[256];
  const int per_block = blockDim.x / group;
  const std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * per_block + threadIdx.x / group;
  const int lane = threadIdx.x & (group - 1);
  State s = r.init();
  std::int64_t off[2] = {0, 0};
  if (o < plan.n_out) {
    plan.outer.offsets(o, off);
    const std::int64_t begin = blockIdx.y * plan.chunk;
    const std::int64_t end = begin + plan.chunk < plan.n_red ? begin + plan.chunk : plan.n_red;
    if (plan.contiguous_rows) {
      const T* p = in + off[1];
      State s1 = r.init(), s2 = r.init(), s3 = r.init();
      std::int64_t i = begin;
      if (kVec > 1) {
        // Scalar head up to 16-byte alignment, then vectors, then the tail.
        std::int64_t head = (16 - (reinterpret_cast<std::uintptr_t>(p + i) & 15)) / sizeof(T) % kVec;
        head = head < end - i ? head : end - i;
        if (lane < head) s = r.combine(s, r.load(p[i + lane], i + lane));
        i += head;
        const std::int64_t nvec = (end - i) / kVec;
        const Vec<T, kVec>* pv = reinterpret_cast<const Vec<T, kVec>*>(p + i);
        std::int64_t j = lane;
        for (; j + 3 * group < nvec; j += 4 * group) {
          Vec<T, kVec> a = pv[j], b = pv[j + group], c = pv[j + 2 * group], d = pv[j + 3 * group];
          std::int64_t base = i + j * kVec;
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            s = r.combine(s, r.load(a.v[k], base + k));
            s1 = r.combine(s1, r.load(b.v[k], base + group * kVec + k));
            s2 = r.combine(s2, r.load(c.v[k], base + 2 * group * kVec + k));
            s3 = r.combine(s3, r.load(d.v[k], base + 3 * group * kVec + k));
          }
        }
        for (; j < nvec; j += group) {
          Vec<T, kVec> a = pv[j];
#pragma unroll
          for (int k = 0; k < kVec; ++k) s = r.combine(s, r.load(a.v[k], i + j * kVec + k));
        }
        i += nvec * kVec;
      }
      for (std::int64_t k = i + lane; k < end; k += group) s = r.combine(s, r.load(p[k], k));
      s = r.combine(r.combine(s, s1), r.combine(s2, s3));
    } else {
      const T* p = in + off[1];
      for (std::int64_t k = begin + lane; k < end; k += group) {
        std::int64_t ioff[1];
        plan.inner.offsets(k, ioff);
        s = r.combine(s, r.load(p[ioff[0]], k));
      }
    }
  }
  s = group_reduce(r, s, smem, group);
  if (lane == 0 && o < plan.n_out) {
    if (plan.splits > 1)
      partial[blockIdx.y * plan.n_out + o] = s;
    else
      r.write(out, off[0], s);
  }
}

// Column mode: block (32, 8); threadIdx.x takes consecutive outputs, threadIdx.y splits the range.
template <class R>
__global__ void __launch_bounds__(256) reduce_col_kernel(R r, Plan plan, const typename R::In* __restrict__ in,
                                                         typename R::Out* out, typename R::State* partial) {
  using State = typename R::State;
  __shared__ State smem[8][33];
  const std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  State s = r.init();
  std::int64_t off[2] = {0, 0};
  if (o < plan.n_out) {
    plan.outer.offsets(o, off);
    const std::int64_t begin = blockIdx.y * plan.chunk;
    const std::int64_t end = begin + plan.chunk < plan.n_red ? begin + plan.chunk : plan.n_red;
    const auto* p = in + off[1];
    if (plan.inner.ndim == 1) {
      const std::int64_t st = plan.inner.strides[0][0];
      for (std::int64_t k = begin + threadIdx.y; k < end; k += 8) s = r.combine(s, r.load(p[k * st], k));
    } else {
      for (std::int64_t k = begin + threadIdx.y; k < end; k += 8) {
        std::int64_t ioff[1];
        plan.inner.offsets(k, ioff);
        s = r.combine(s, r.load(p[ioff[0]], k));
      }
    }
  }
  smem[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && o < plan.n_out) {
#pragma unroll
    for (int y = 1; y < 8; ++y) s = r.combine(s, smem[y][threadIdx.x]);
    if (plan.splits > 1)
      partial[blockIdx.y * plan.n_out + o] = s;
    else
      r.write(out, off[0], s);
  }
}

// Column mode on 16-byte packs, for the scalar reducers over one reduced dim of a contiguous
// [rows, columns] layout (a linear layer's bias gradient: the sum of dy [N, out] over N): a thread
// takes kVec adjacent outputs, so each load is 16 bytes instead of 2, and keeps four rows' loads in
// flight. The element-per-thread kernel above ran a bf16 [8192, 768] sum at 16 us plus 5 us of
// finishing on an H100, where its 12.6 MB take 4 us. Each output's rows are combined in the same
// order as there (row by row within a thread's share, then the 8 shares, then the chunks).
template <class R, int kVec>
__global__ void __launch_bounds__(256)
    reduce_col_vec_kernel(R r, std::int64_t n_out, std::int64_t n_red, std::int64_t row_stride, std::int64_t chunk,
                          const typename R::In* __restrict__ in, typename R::Out* out, typename R::State* partial,
                          int splits) {
  using T = typename R::In;
  using State = typename R::State;
  using Pack = Vec<T, kVec>;
  __shared__ State smem[8][32 * kVec + 1];
  const std::int64_t v = std::int64_t{blockIdx.x} * 32 + threadIdx.x;  // the pack of outputs
  State s[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) s[j] = r.init();
  const auto take = [&](const Pack& pk, std::int64_t k) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) s[j] = r.combine(s[j], r.load(pk.v[j], k));
  };
  if (v < n_out / kVec) {
    const Pack* p = reinterpret_cast<const Pack*>(in) + v;
    const std::int64_t ps = row_stride / kVec;
    const std::int64_t begin = blockIdx.y * chunk, end = begin + chunk < n_red ? begin + chunk : n_red;
    std::int64_t k = begin + threadIdx.y;
    for (; k + 24 < end; k += 32) {
      const Pack a = p[k * ps], b = p[(k + 8) * ps], c = p[(k + 16) * ps], d = p[(k + 24) * ps];
      take(a, k);
      take(b, k + 8);
      take(c, k + 16);
      take(d, k + 24);
    }
    for (; k < end; k += 8) take(p[k * ps], k);
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) smem[threadIdx.y][threadIdx.x * kVec + j] = s[j];
  __syncthreads();
  if (threadIdx.y != 0 || v >= n_out / kVec) return;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    State t = s[j];
    for (int y = 1; y < 8; ++y) t = r.combine(t, smem[y][threadIdx.x * kVec + j]);
    const std::int64_t o = v * kVec + j;
    if (splits > 1)
      partial[blockIdx.y * n_out + o] = t;
    else
      r.write(out, o, t);
  }
}

template <class R>
__global__ void __launch_bounds__(256)
    reduce_finalize_kernel(R r, Plan plan, const typename R::State* partial, typename R::Out* out) {
  const std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= plan.n_out) return;
  typename R::State s = partial[o];
  for (int y = 1; y < plan.splits; ++y) s = r.combine(s, partial[y * plan.n_out + o]);
  std::int64_t off[2];
  plan.outer.offsets(o, off);
  r.write(out, off[0], s);
}

// Full reduction of one contiguous range to a single output (e.g. the sum of a whole tensor):
// one wave of blocks, grid-stride over 16-byte vectors with four independent loads in flight per
// thread; each block leaves one partial, then reduce_partials_kernel (one block) combines them in
// a fixed order. Block 0 also takes the unaligned head, the last block the tail.
template <class R, int kVec>
__global__ void __launch_bounds__(256) reduce_all_kernel(R r, const typename R::In* __restrict__ in, std::int64_t n,
                                                         typename R::Out* out, typename R::State* partial) {
  using State = typename R::State;
  using T = typename R::In;
  __shared__ State smem[256];
  State s = r.init(), s1 = r.init(), s2 = r.init(), s3 = r.init();
  std::int64_t head = 0;
  if (kVec > 1) {
    head = (16 - (reinterpret_cast<std::uintptr_t>(in) & 15)) / sizeof(T) % kVec;
    head = head < n ? head : n;
  }
  const std::int64_t nvec = (n - head) / kVec;
  const std::int64_t tail = head + nvec * kVec;
  if (blockIdx.x == 0 && threadIdx.x < head) s = r.combine(s, r.load(in[threadIdx.x], threadIdx.x));
  if (blockIdx.x == gridDim.x - 1)
    for (std::int64_t k = tail + threadIdx.x; k < n; k += blockDim.x) s1 = r.combine(s1, r.load(in[k], k));
  const Vec<T, kVec>* pv = reinterpret_cast<const Vec<T, kVec>*>(in + head);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; j + 3 * stride < nvec; j += 4 * stride) {
    Vec<T, kVec> a = pv[j], b = pv[j + stride], c = pv[j + 2 * stride], d = pv[j + 3 * stride];
    const std::int64_t base = head + j * kVec;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      s = r.combine(s, r.load(a.v[k], base + k));
      s1 = r.combine(s1, r.load(b.v[k], base + stride * kVec + k));
      s2 = r.combine(s2, r.load(c.v[k], base + 2 * stride * kVec + k));
      s3 = r.combine(s3, r.load(d.v[k], base + 3 * stride * kVec + k));
    }
  }
  for (; j < nvec; j += stride) {
    Vec<T, kVec> a = pv[j];
#pragma unroll
    for (int k = 0; k < kVec; ++k) s = r.combine(s, r.load(a.v[k], head + j * kVec + k));
  }
  s = r.combine(r.combine(s, s1), r.combine(s2, s3));
  s = group_reduce(r, s, smem, 256);
  if (threadIdx.x == 0) {
    if (gridDim.x > 1)
      partial[blockIdx.x] = s;
    else
      r.write(out, 0, s);
  }
}

template <class R>
__global__ void __launch_bounds__(256)
    reduce_partials_kernel(R r, const typename R::State* __restrict__ partial, int count, typename R::Out* out) {
  using State = typename R::State;
  __shared__ State smem[256];
  State s = r.init();
  for (int i = threadIdx.x; i < count; i += blockDim.x) s = r.combine(s, partial[i]);
  s = group_reduce(r, s, smem, 256);
  if (threadIdx.x == 0) r.write(out, 0, s);
}

template <class R>
void run_reduce(const R& r, const Tensor& in, std::span<const int> dims, const Tensor& out) {
  using State = typename R::State;
  using T = typename R::In;
  Plan plan;
  Shape outer_shape, inner_shape;
  Strides outer_in, outer_out, inner_in;
  for (int d = 0; d < static_cast<int>(in.dim()); ++d) {
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) {
      inner_shape.push_back(in.shape()[d]);
      inner_in.push_back(in.strides()[d]);
    } else {
      outer_shape.push_back(in.shape()[d]);
      outer_in.push_back(in.strides()[d]);
      outer_out.push_back(out.strides()[d]);
    }
  }
  plan.outer = make_indexer<2>(outer_shape, {&outer_out, &outer_in});
  plan.inner = make_indexer<1>(inner_shape, {&inner_in});
  plan.n_out = numel_of(outer_shape);
  plan.n_red = numel_of(inner_shape);
  if (plan.n_out == 0) return;
  Launch l(out);
  const int target_blocks = device_info(l.index).sms * 4;
  plan.contiguous_rows = plan.inner.ndim == 0 || (plan.inner.ndim == 1 && plan.inner.strides[0][0] == 1);
  const bool column = !plan.contiguous_rows && plan.outer.ndim >= 1 && plan.outer.strides[1][plan.outer.ndim - 1] == 1;
  const T* x = static_cast<const T*>(in.data_ptr());
  auto* o = static_cast<typename R::Out*>(out.data_ptr());
  constexpr int kVec = 16 / sizeof(T) > 1 ? static_cast<int>(16 / sizeof(T)) : 1;

  if (plan.n_out == 1 && plan.contiguous_rows) {
    // Everything into one value: a single wave (full occupancy), at least 4 vectors per thread.
    const auto& di = device_info(l.index);
    const std::int64_t wave = std::int64_t{di.sms} * (di.max_threads_per_sm / 256);
    const std::int64_t want = (plan.n_red / kVec + 256 * 4 - 1) / (256 * 4);
    const int blocks = static_cast<int>(std::clamp<std::int64_t>(want, 1, wave));
    // (n_out == 1: every kept dim has size 1, so both base offsets are 0.)
    Scratch scratch(blocks > 1 ? sizeof(State) * blocks : 0, l.index);
    reduce_all_kernel<R, kVec><<<blocks, 256, 0, l.stream>>>(r, x, plan.n_red, o, scratch.as<State>());
    KILN_CUDA_CHECK_LAUNCH();
    if (blocks > 1) {
      reduce_partials_kernel<R><<<1, 256, 0, l.stream>>>(r, scratch.as<State>(), blocks, o);
      KILN_CUDA_CHECK_LAUNCH();
    }
    return;
  }

  if (column) {
    // On 16-byte packs of outputs (reduce_col_vec_kernel) where the scalar reducers meet one kept dim
    // of stride 1 in and out and one reduced dim whose stride keeps the packs aligned.
    bool packs = false;
    if constexpr (std::is_floating_point_v<State> && kVec > 1)
      packs = plan.outer.ndim == 1 && plan.inner.ndim == 1 && plan.outer.strides[0][0] == 1 && plan.n_out % kVec == 0 &&
              plan.inner.strides[0][0] % kVec == 0 && aligned16(x);
    const std::int64_t bx = ((packs ? plan.n_out / kVec : plan.n_out) + 31) / 32;
    // Enough blocks to fill the GPU, at least 64 rows each; with packs at most 64 chunks, so the
    // finishing pass stays short (the blocks are few and wide).
    std::int64_t splits = std::max<std::int64_t>(1, target_blocks / bx);
    splits = std::min<std::int64_t>(splits, std::max<std::int64_t>(1, plan.n_red / 64));
    splits = std::min<std::int64_t>(splits, packs ? 64 : 65535);
    plan.chunk = (plan.n_red + splits - 1) / splits;
    plan.splits = static_cast<int>((plan.n_red + plan.chunk - 1) / std::max<std::int64_t>(plan.chunk, 1));
    if (plan.splits < 1) plan.splits = 1;
    KILN_CHECK(bx < (std::int64_t{1} << 31), "reduce: too many outputs");
    Scratch scratch(plan.splits > 1 ? sizeof(State) * plan.splits * plan.n_out : 0, l.index);
    const dim3 grid(static_cast<unsigned>(bx), plan.splits), block(32, 8);
    if constexpr (std::is_floating_point_v<State> && kVec > 1) {
      if (packs)
        reduce_col_vec_kernel<R, kVec><<<grid, block, 0, l.stream>>>(
            r, plan.n_out, plan.n_red, plan.inner.strides[0][0], plan.chunk, x, o, scratch.as<State>(), plan.splits);
    }
    if (!packs) reduce_col_kernel<R><<<grid, block, 0, l.stream>>>(r, plan, x, o, scratch.as<State>());
    KILN_CUDA_CHECK_LAUNCH();
    if (plan.splits > 1) {
      reduce_finalize_kernel<R>
          <<<static_cast<unsigned>((plan.n_out + 255) / 256), 256, 0, l.stream>>>(r, plan, scratch.as<State>(), o);
      KILN_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  // Row mode: a warp per output for short rows, a block for long ones.
  const int group = plan.n_red <= 1024 ? 32 : 256;
  const std::int64_t per_block = 256 / group;
  const std::int64_t bx = (plan.n_out + per_block - 1) / per_block;
  std::int64_t splits = std::max<std::int64_t>(1, target_blocks / bx);
  splits = std::min<std::int64_t>(splits, std::max<std::int64_t>(1, plan.n_red / (group * 16)));
  splits = std::min<std::int64_t>(splits, 65535);
  plan.chunk = std::max<std::int64_t>(1, (plan.n_red + splits - 1) / splits);
  if (kVec > 1) plan.chunk = (plan.chunk + kVec - 1) / kVec * kVec;  // chunks stay vector-aligned
  plan.splits = static_cast<int>((plan.n_red + plan.chunk - 1) / plan.chunk);
  if (plan.splits < 1) plan.splits = 1;
  KILN_CHECK(bx < (std::int64_t{1} << 31), "reduce: too many outputs");
  Scratch scratch(plan.splits > 1 ? sizeof(State) * plan.splits * plan.n_out : 0, l.index);
  reduce_row_kernel<R, kVec>
      <<<dim3(static_cast<unsigned>(bx), plan.splits), 256, 0, l.stream>>>(r, plan, x, o, scratch.as<State>(), group);
  KILN_CUDA_CHECK_LAUNCH();
  if (plan.splits > 1) {
    reduce_finalize_kernel<R>
        <<<static_cast<unsigned>((plan.n_out + 255) / 256), 256, 0, l.stream>>>(r, plan, scratch.as<State>(), o);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

// ---- conv2d bias gradient -----------------------------------------------------------------------

// grad_b[k] = sum over n, hw of grad_y[n, k, hw] (contiguous NCHW). Block (k, s) sums images
// s, s + S, ... of channel k; with S > 1 the partials go to a scratch buffer, combined in a fixed
// order by bias_grad_finalize_kernel (deterministic, no atomics).
template <class T>
__global__ void __launch_bounds__(256) bias_grad_kernel(const T* __restrict__ gy, std::int64_t n, std::int64_t k,
                                                        std::int64_t hw, acc_t<T>* partial, DynPtr out) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const std::int64_t ch = blockIdx.x;
  const std::int64_t s = blockIdx.y, splits = gridDim.y;
  A acc = 0;
  if (hw >= 128) {
    for (std::int64_t img = s; img < n; img += splits) {
      const T* p = gy + (img * k + ch) * hw;
      for (std::int64_t i = threadIdx.x; i < hw; i += blockDim.x) acc += load_as<A>(p[i]);
    }
  } else {
    // Small planes: a flat index over this block's (image, position) pairs keeps every thread busy.
    const std::int64_t imgs = (n - s + splits - 1) / splits;
    const std::uint32_t uhw = static_cast<std::uint32_t>(hw);
    for (std::int64_t j = threadIdx.x; j < imgs * hw; j += blockDim.x) {
      const std::uint32_t q = static_cast<std::uint32_t>(j) / uhw, r = static_cast<std::uint32_t>(j) - q * uhw;
      const std::int64_t img = s + static_cast<std::int64_t>(q) * splits;
      acc += load_as<A>(gy[(img * k + ch) * hw + r]);
    }
  }
  acc = block_sum(acc, sh);
  if (threadIdx.x != 0) return;
  if (splits > 1)
    partial[s * k + ch] = acc;
  else
    store_dyn(out.p, out.t, ch, acc);
}

template <class A>
__global__ void __launch_bounds__(256)
    bias_grad_finalize_kernel(const A* __restrict__ partial, std::int64_t k, int splits, DynPtr out) {
  const std::int64_t ch = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= k) return;
  A acc = partial[ch];
  for (int s = 1; s < splits; ++s) acc += partial[s * k + ch];
  store_dyn(out.p, out.t, ch, acc);
}

}  // namespace

void conv_bias_grad(const Tensor& grad_y, const Tensor& grad_b) {
  KILN_CHECK(grad_y.dim() == 4 && grad_y.is_contiguous(),
             "conv2d bias gradient: grad_y must be contiguous NCHW, got {}", grad_y.describe());
  const std::int64_t n = grad_y.shape()[0], k = grad_y.shape()[1], hw = grad_y.shape()[2] * grad_y.shape()[3];
  KILN_CHECK(grad_b.numel() == k && grad_b.is_contiguous(), "conv2d bias gradient: grad_b {} for {} channels",
             grad_b.describe(), k);
  if (k == 0) return;
  Launch l(grad_y);
  if (n == 0 || hw == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(grad_b.data_ptr(), 0, grad_b.nbytes(), l.stream));
    return;
  }
  KILN_CHECK(k < 65536 * 32768LL, "conv2d bias gradient: {} channels", k);
  const std::int64_t target_blocks = std::int64_t{device_info(l.index).sms} * 4;
  const int splits =
      static_cast<int>(std::clamp<std::int64_t>((target_blocks + k - 1) / k, 1, std::min<std::int64_t>(n, 65535)));
  KILN_DISPATCH_FLOATING(grad_y.dtype(), "conv2d_bias_grad", [&]<class T>() {
    using A = acc_t<T>;
    Scratch scratch(splits > 1 ? sizeof(A) * splits * k : 0, l.index);
    bias_grad_kernel<T><<<dim3(static_cast<unsigned>(k), static_cast<unsigned>(splits)), 256, 0, l.stream>>>(
        static_cast<const T*>(grad_y.data_ptr()), n, k, hw, scratch.as<A>(), dyn(grad_b));
    KILN_CUDA_CHECK_LAUNCH();
    if (splits > 1) {
      bias_grad_finalize_kernel<A>
          <<<static_cast<unsigned>((k + 255) / 256), 256, 0, l.stream>>>(scratch.as<A>(), k, splits, dyn(grad_b));
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
}

namespace {}  // namespace

void reduce(ReduceOp op, const Tensor& in, std::span<const int> dims, const Tensor& out) {
  KILN_DISPATCH_NUMERIC(in.dtype(), "reduce", [&]<class T>() {
    std::int64_t count = 1;
    for (int d : dims) count *= in.shape()[d];
    run_reduce(ScalarReducer<T>{op, count}, in, dims, out);
  });
}

void variance(const Tensor& in, std::span<const int> dims, int correction, const Tensor& out) {
  KILN_DISPATCH_FLOATING(in.dtype(), "var",
                         [&]<class T>() { run_reduce(WelfordReducer<T>{correction}, in, dims, out); });
}

void arg_reduce(bool is_max, const Tensor& in, int dim, const Tensor& out) {
  int dims[1] = {dim};
  KILN_DISPATCH_NUMERIC(in.dtype(), "argmax", [&]<class T>() { run_reduce(ArgReducer<T>{is_max}, in, dims, out); });
}

}  // namespace kiln::ops::cuda
