// CUDA softmax / log-softmax over the last dim and cross-entropy with ignore_index and label
// smoothing. A warp per row for rows up to 1024 wide, a block per row beyond; the row max and the
// sum of exponentials are computed in one online pass, then one pass writes.
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/cuda_kernels.h"

namespace kiln::ops::cuda {

namespace {

// Online (max, sum of exp(x - max)) merge.
template <class A>
struct MaxSumT {
  A m, s;
};
__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }
__device__ __forceinline__ double fast_exp(double x) { return exp(x); }

template <class A>
__device__ __forceinline__ MaxSumT<A> ms_merge(MaxSumT<A> a, MaxSumT<A> b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  A m = a.m > b.m ? a.m : b.m;
  return {m, a.s * fast_exp(a.m - m) + b.s * fast_exp(b.m - m)};
}

template <int kGroup, class A>
__device__ __forceinline__ MaxSumT<A> group_maxsum(MaxSumT<A> v, MaxSumT<A>* sh) {
  using MaxSum = MaxSumT<A>;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = ms_merge(v, other);
  }
  if constexpr (kGroup > 32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < (kGroup >> 5) ? sh[lane] : MaxSum{-INFINITY, A(0)};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
      v = ms_merge(v, other);
    }
  }
  return v;
}

// Sum over the kGroup threads of a row. block_sum reduces within each warp itself: reducing with
// warp_sum first (as this once did) made every lane hold the warp total, so the block sum came out
// 32x too large on the block-per-row path (softmax backward and label-smoothed cross-entropy for
// rows wider than 1024).
template <int kGroup, class A>
__device__ __forceinline__ A group_sum(A v, A* sh) {
  if constexpr (kGroup > 32)
    return block_sum(v, sh);
  else
    return warp_sum(v);
}

// Row statistics in the accumulation type (float, double for f64); exp is evaluated relative to
// the running max, so float is accurate.
template <class T, int kGroup, class A = acc_t<T>>
__device__ __forceinline__ MaxSumT<A> row_maxsum(const T* xr, std::int64_t d, int lane, MaxSumT<A>* sh) {
  MaxSumT<A> v{-INFINITY, A(0)};
  for (std::int64_t k = lane; k < d; k += kGroup) {
    A x = load_as<A>(xr[k]);
    if (x == -INFINITY) continue;
    if (x > v.m) {
      v.s = v.s * fast_exp(v.m - x) + A(1);
      v.m = x;
    } else {
      v.s += fast_exp(x - v.m);
    }
    if (x != x) v.m = x;  // NaN propagates
  }
  return group_maxsum<kGroup>(v, sh);
}

template <class T, int kGroup>
__global__ void __launch_bounds__(256) softmax_fwd_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                          std::int64_t rows, std::int64_t d, bool log) {
  using A = acc_t<T>;
  __shared__ MaxSumT<A> sh[32];
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / kGroup) + threadIdx.x / kGroup;
  const int lane = threadIdx.x % kGroup;
  const std::int64_t r = row < rows ? row : rows - 1;
  const T* xr = x + r * d;
  MaxSumT<A> ms = row_maxsum<T, kGroup>(xr, d, lane, sh);
  if (row >= rows) return;
  T* yr = y + r * d;
  const A lse_off = ms.m + ::log(ms.s);
  const A inv = A(1) / ms.s;
  for (std::int64_t k = lane; k < d; k += kGroup) {
    A v = load_as<A>(xr[k]);
    yr[k] = store_as<T>(log ? v - lse_off : exp(v - ms.m) * inv);
  }
}

// softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy).
template <class T, int kGroup>
__global__ void __launch_bounds__(256) softmax_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ y,
                                                          T* __restrict__ dx, std::int64_t rows, std::int64_t d,
                                                          bool log) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / kGroup) + threadIdx.x / kGroup;
  const int lane = threadIdx.x % kGroup;
  const std::int64_t r = row < rows ? row : rows - 1;
  const T* gr = dy + r * d;
  const T* yr = y + r * d;
  A s = 0;
  for (std::int64_t k = lane; k < d; k += kGroup) {
    A g = load_as<A>(gr[k]);
    s += log ? g : g * load_as<A>(yr[k]);
  }
  s = group_sum<kGroup>(s, sh);
  if (row >= rows) return;
  T* dr = dx + r * d;
  for (std::int64_t k = lane; k < d; k += kGroup) {
    A g = load_as<A>(gr[k]), yv = load_as<A>(yr[k]);
    dr[k] = store_as<T>(log ? g - exp(yv) * s : yv * (g - s));
  }
}

template <class T, int kGroup>
__global__ void __launch_bounds__(256) ce_fwd_kernel(const T* __restrict__ logits, const std::int64_t* __restrict__ target,
                                                     std::int64_t rows, std::int64_t c, std::int64_t ignore,
                                                     double smoothing, DynPtr loss, DynPtr lse) {
  using A = acc_t<T>;
  __shared__ MaxSumT<A> sh[32];
  __shared__ A shs[32];
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / kGroup) + threadIdx.x / kGroup;
  const int lane = threadIdx.x % kGroup;
  const std::int64_t r = row < rows ? row : rows - 1;
  const T* xr = logits + r * c;
  MaxSumT<A> ms = row_maxsum<T, kGroup>(xr, c, lane, sh);
  A sum_x = 0;
  if (smoothing > 0)
    for (std::int64_t k = lane; k < c; k += kGroup) sum_x += load_as<A>(xr[k]);
  sum_x = group_sum<kGroup>(sum_x, shs);
  if (row >= rows || lane != 0) return;
  const A l = ms.m + ::log(ms.s);
  store_dyn(lse.p, lse.t, r, l);
  const std::int64_t t = target[r];
  A value;
  if (t == ignore) {
    value = 0;
  } else if (t < 0 || t >= c) {
    value = NAN;  // out-of-range class
  } else {
    const A xt = load_as<A>(xr[t]);
    const A eps = static_cast<A>(smoothing);
    value = (A(1) - eps) * (l - xt) + eps * (l - sum_x / static_cast<A>(c));
  }
  store_dyn(loss.p, loss.t, r, value);
}

// grad = (softmax - ((1 - eps) * onehot + eps / C)) * grad_loss[row]; zero for ignored rows.
template <class T>
__global__ void __launch_bounds__(256) ce_bwd_kernel(DynPtr grad_loss, const T* __restrict__ logits,
                                                     const std::int64_t* __restrict__ target, DynPtr lse,
                                                     T* __restrict__ grad, std::int64_t rows, std::int64_t c,
                                                     std::int64_t ignore, double smoothing) {
  // A block row-strip: blockIdx.y = row, threads over classes (grid-stride in x).
  const std::int64_t r = blockIdx.y + static_cast<std::int64_t>(blockIdx.z) * 65535;
  if (r >= rows) return;
  const std::int64_t t = target[r];
  const bool ignored = t == ignore;
  using A = acc_t<T>;
  const A g = ignored ? A(0) : static_cast<A>(load_dyn(grad_loss.p, grad_loss.t, r));
  const A l = static_cast<A>(load_dyn(lse.p, lse.t, r));
  const A eps = static_cast<A>(smoothing);
  const A off = eps / static_cast<A>(c);
  const T* xr = logits + r * c;
  T* gr = grad + r * c;
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < c;
       k += std::int64_t{blockDim.x} * gridDim.x) {
    A p = exp(load_as<A>(xr[k]) - l);
    A target_p = (k == t ? A(1) - eps : A(0)) + off;
    gr[k] = store_as<T>(ignored ? A(0) : (p - target_p) * g);
  }
}

}  // namespace

void softmax_forward(const Tensor& x, bool log, const Tensor& y) {
  const std::int64_t d = x.dim() ? x.shape().back() : 1;
  const std::int64_t rows = d ? x.numel() / d : 0;
  if (rows == 0) return;
  Launch l(x);
  KILN_DISPATCH_FLOATING(x.dtype(), "softmax", [&]<class T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    if (d <= 1024)
      softmax_fwd_kernel<T, 32><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, l.stream>>>(xp, yp, rows, d, log);
    else
      softmax_fwd_kernel<T, 256><<<static_cast<unsigned>(rows), 256, 0, l.stream>>>(xp, yp, rows, d, log);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void softmax_backward(const Tensor& grad_y, const Tensor& y, bool log, const Tensor& grad_x) {
  const std::int64_t d = y.dim() ? y.shape().back() : 1;
  const std::int64_t rows = d ? y.numel() / d : 0;
  if (rows == 0) return;
  Launch l(y);
  KILN_DISPATCH_FLOATING(y.dtype(), "softmax_backward", [&]<class T>() {
    const T* gp = static_cast<const T*>(grad_y.data_ptr());
    const T* yp = static_cast<const T*>(y.data_ptr());
    T* dp = static_cast<T*>(grad_x.data_ptr());
    if (d <= 1024)
      softmax_bwd_kernel<T, 32><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, l.stream>>>(gp, yp, dp, rows, d, log);
    else
      softmax_bwd_kernel<T, 256><<<static_cast<unsigned>(rows), 256, 0, l.stream>>>(gp, yp, dp, rows, d, log);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_forward(const Tensor& logits, const Tensor& target, std::int64_t ignore_index,
                           double label_smoothing, const Tensor& loss, const Tensor& lse) {
  const std::int64_t rows = logits.shape()[0], c = logits.shape()[1];
  if (rows == 0) return;
  KILN_CHECK(target.dtype() == DType::I64, "cross_entropy: target must be int64, got {}", target.describe());
  Launch l(logits);
  const double eps = label_smoothing;
  KILN_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", [&]<class T>() {
    const T* xp = static_cast<const T*>(logits.data_ptr());
    const auto* tp = static_cast<const std::int64_t*>(target.data_ptr());
    if (c <= 1024)
      ce_fwd_kernel<T, 32><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, l.stream>>>(xp, tp, rows, c, ignore_index,
                                                                                       eps, dyn(loss), dyn(lse));
    else
      ce_fwd_kernel<T, 256><<<static_cast<unsigned>(rows), 256, 0, l.stream>>>(xp, tp, rows, c, ignore_index, eps,
                                                                               dyn(loss), dyn(lse));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                            std::int64_t ignore_index, double label_smoothing, const Tensor& grad_logits) {
  const std::int64_t rows = logits.shape()[0], c = logits.shape()[1];
  if (rows == 0 || c == 0) return;
  Launch l(logits);
  const double eps = label_smoothing;
  const unsigned threads = c >= 256 ? 256 : static_cast<unsigned>((c + 31) / 32 * 32);
  const unsigned bx = static_cast<unsigned>(std::min<std::int64_t>((c + threads - 1) / threads, 64));
  const unsigned gy = static_cast<unsigned>(std::min<std::int64_t>(rows, 65535));
  const unsigned gz = static_cast<unsigned>((rows + 65534) / 65535);
  KILN_DISPATCH_FLOATING(logits.dtype(), "cross_entropy_backward", [&]<class T>() {
    ce_bwd_kernel<T><<<dim3(bx, gy, gz), threads, 0, l.stream>>>(
        dyn(grad_loss), static_cast<const T*>(logits.data_ptr()), static_cast<const std::int64_t*>(target.data_ptr()),
        dyn(lse), static_cast<T*>(grad_logits.data_ptr()), rows, c, ignore_index, eps);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace kiln::ops::cuda
