// CUDA max/avg/adaptive-avg pooling over NCHW (contiguous; adaptive average pooling also over
// channels-last NHWC, channel fastest). Forward: a thread per output.
// Backward: a thread per input element that gathers from the outputs whose windows cover it,
// so there are no atomics and results are deterministic (grad_x needs no zeroing).
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/cuda_kernels.h"
#include "kiln/ops/memory_format.h"

namespace kiln::ops::cuda {

namespace {

struct PoolShape {
  std::int64_t nc;  // N * C planes
  int h, w, oh, ow;
  int kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
};

PoolShape pool_shape(const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  KILN_CHECK(x.dim() == 4 && y.dim() == 4, "pool2d: expected NCHW tensors, got {} and {}", x.describe(), y.describe());
  return PoolShape{x.shape()[0] * x.shape()[1],
                   static_cast<int>(x.shape()[2]),
                   static_cast<int>(x.shape()[3]),
                   static_cast<int>(y.shape()[2]),
                   static_cast<int>(y.shape()[3]),
                   p.kernel_h,
                   p.kernel_w,
                   p.stride_h,
                   p.stride_w,
                   p.pad_h,
                   p.pad_w,
                   p.count_include_pad};
}

#define KILN_GRID_LOOP(i, n)                                                          \
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += std::int64_t{blockDim.x} * gridDim.x)

template <class T>
__global__ void __launch_bounds__(256)
    max_pool_fwd_kernel(PoolShape s, const T* __restrict__ x, T* __restrict__ y, std::int64_t* __restrict__ idx) {
  using A = acc_t<T>;
  const std::int64_t total = s.nc * s.oh * s.ow;
  KILN_GRID_LOOP(i, total) {
    const int ox = static_cast<int>(i % s.ow);
    const int oy = static_cast<int>((i / s.ow) % s.oh);
    const std::int64_t plane = i / (static_cast<std::int64_t>(s.ow) * s.oh);
    const T* xp = x + plane * s.h * s.w;
    int hs = oy * s.sh - s.ph, ws = ox * s.sw - s.pw;
    int he = min(hs + s.kh, s.h), we = min(ws + s.kw, s.w);
    hs = max(hs, 0);
    ws = max(ws, 0);
    A best = -INFINITY;
    std::int64_t best_i = static_cast<std::int64_t>(hs) * s.w + ws;
    for (int yy = hs; yy < he; ++yy)
      for (int xx = ws; xx < we; ++xx) {
        A v = load_as<A>(xp[yy * s.w + xx]);
        if (v > best || v != v) {
          best = v;
          best_i = static_cast<std::int64_t>(yy) * s.w + xx;
          if (v != v) {
            yy = he;  // NaN wins: stop
            break;
          }
        }
      }
    y[i] = store_as<T>(best);
    idx[i] = best_i;
  }
}

template <class T>
__global__ void __launch_bounds__(256) max_pool_bwd_kernel(PoolShape s, const T* __restrict__ gy,
                                                           const std::int64_t* __restrict__ idx, T* __restrict__ gx) {
  using A = acc_t<T>;
  const std::int64_t total = s.nc * s.h * s.w;
  KILN_GRID_LOOP(i, total) {
    const int xx = static_cast<int>(i % s.w);
    const int yy = static_cast<int>((i / s.w) % s.h);
    const std::int64_t plane = i / (static_cast<std::int64_t>(s.w) * s.h);
    const std::int64_t here = static_cast<std::int64_t>(yy) * s.w + xx;
    // Outputs whose window covers (yy, xx): oy*sh - ph <= yy < oy*sh - ph + kh.
    const int oy0 = (yy + s.ph < s.kh) ? 0 : (yy + s.ph - s.kh) / s.sh + 1;
    const int oy1 = min((yy + s.ph) / s.sh + 1, s.oh);
    const int ox0 = (xx + s.pw < s.kw) ? 0 : (xx + s.pw - s.kw) / s.sw + 1;
    const int ox1 = min((xx + s.pw) / s.sw + 1, s.ow);
    const std::int64_t base = plane * s.oh * s.ow;
    A acc = 0;
    for (int oy = oy0; oy < oy1; ++oy)
      for (int ox = ox0; ox < ox1; ++ox) {
        const std::int64_t o = base + static_cast<std::int64_t>(oy) * s.ow + ox;
        if (idx[o] == here) acc += load_as<A>(gy[o]);
      }
    gx[i] = store_as<T>(acc);
  }
}

// PyTorch's avg_pool2d window (ceil_mode off): the divisor counts padding when asked.
__device__ __forceinline__ int avg_divisor(const PoolShape& s, int oy, int ox, int& hs, int& he, int& ws, int& we) {
  hs = oy * s.sh - s.ph;
  ws = ox * s.sw - s.pw;
  he = min(hs + s.kh, s.h + s.ph);
  we = min(ws + s.kw, s.w + s.pw);
  const int pool = (he - hs) * (we - ws);
  hs = max(hs, 0);
  ws = max(ws, 0);
  he = min(he, s.h);
  we = min(we, s.w);
  return s.count_include_pad ? pool : (he - hs) * (we - ws);
}

template <class T>
__global__ void __launch_bounds__(256) avg_pool_fwd_kernel(PoolShape s, const T* __restrict__ x, T* __restrict__ y) {
  using A = acc_t<T>;
  const std::int64_t total = s.nc * s.oh * s.ow;
  KILN_GRID_LOOP(i, total) {
    const int ox = static_cast<int>(i % s.ow);
    const int oy = static_cast<int>((i / s.ow) % s.oh);
    const std::int64_t plane = i / (static_cast<std::int64_t>(s.ow) * s.oh);
    const T* xp = x + plane * s.h * s.w;
    int hs, he, ws, we;
    const int div = avg_divisor(s, oy, ox, hs, he, ws, we);
    A acc = 0;
    for (int yy = hs; yy < he; ++yy)
      for (int xx = ws; xx < we; ++xx) acc += load_as<A>(xp[yy * s.w + xx]);
    y[i] = store_as<T>(acc / static_cast<A>(div));
  }
}

template <class T>
__global__ void __launch_bounds__(256) avg_pool_bwd_kernel(PoolShape s, const T* __restrict__ gy, T* __restrict__ gx) {
  using A = acc_t<T>;
  const std::int64_t total = s.nc * s.h * s.w;
  KILN_GRID_LOOP(i, total) {
    const int xx = static_cast<int>(i % s.w);
    const int yy = static_cast<int>((i / s.w) % s.h);
    const std::int64_t plane = i / (static_cast<std::int64_t>(s.w) * s.h);
    const int oy0 = (yy + s.ph < s.kh) ? 0 : (yy + s.ph - s.kh) / s.sh + 1;
    const int oy1 = min((yy + s.ph) / s.sh + 1, s.oh);
    const int ox0 = (xx + s.pw < s.kw) ? 0 : (xx + s.pw - s.kw) / s.sw + 1;
    const int ox1 = min((xx + s.pw) / s.sw + 1, s.ow);
    const std::int64_t base = plane * s.oh * s.ow;
    A acc = 0;
    for (int oy = oy0; oy < oy1; ++oy)
      for (int ox = ox0; ox < ox1; ++ox) {
        int hs, he, ws, we;
        const int div = avg_divisor(s, oy, ox, hs, he, ws, we);
        if (yy >= hs && yy < he && xx >= ws && xx < we)
          acc += load_as<A>(gy[base + static_cast<std::int64_t>(oy) * s.ow + ox]) / static_cast<A>(div);
      }
    gx[i] = store_as<T>(acc);
  }
}

__device__ __forceinline__ int adaptive_start(int o, int in, int out) { return (o * in) / out; }
__device__ __forceinline__ int adaptive_end(int o, int in, int out) { return ((o + 1) * in + out - 1) / out; }

// One warp per output: global average pooling (the ResNet head) reads whole planes coalesced.
template <class T>
__global__ void __launch_bounds__(256)
    adaptive_avg_fwd_kernel(PoolShape s, const T* __restrict__ x, T* __restrict__ y) {
  using A = acc_t<T>;
  const std::int64_t total = s.nc * s.oh * s.ow;
  const int lane = threadIdx.x & 31;
  const std::int64_t warps = (std::int64_t{blockDim.x} * gridDim.x) >> 5;
  for (std::int64_t i = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) >> 5; i < total; i += warps) {
    const int ox = static_cast<int>(i % s.ow);
    const int oy = static_cast<int>((i / s.ow) % s.oh);
    const std::int64_t plane = i / (static_cast<std::int64_t>(s.ow) * s.oh);
    const T* xp = x + plane * s.h * s.w;
    const int hs = adaptive_start(oy, s.h, s.oh), he = adaptive_end(oy, s.h, s.oh);
    const int ws = adaptive_start(ox, s.w, s.ow), we = adaptive_end(ox, s.w, s.ow);
    const int wn = we - ws, cnt = (he - hs) * wn;
    A acc = 0;
    for (int k = lane; k < cnt; k += 32) acc += load_as<A>(xp[(hs + k / wn) * s.w + ws + k % wn]);
    acc = warp_reduce(acc, [](A a, A b) { return a + b; });
    if (lane == 0) y[i] = store_as<T>(acc / static_cast<A>(cnt));
  }
}

// Channels-last (NHWC): a thread per output element, channel fastest, so a warp reads 32 adjacent
// channels of each window pixel (the ResNet head's global pool: [N, 4, 4, 512] to [N, 1, 1, 512]).
template <class T>
__global__ void __launch_bounds__(256)
    adaptive_avg_fwd_nhwc_kernel(PoolShape s, std::int64_t c, const T* __restrict__ x, T* __restrict__ y) {
  using A = acc_t<T>;
  const std::int64_t total = s.nc * s.oh * s.ow;
  KILN_GRID_LOOP(i, total) {
    const std::int64_t ch = i % c;
    const int ox = static_cast<int>((i / c) % s.ow);
    const int oy = static_cast<int>((i / (c * s.ow)) % s.oh);
    const std::int64_t img = i / (c * s.ow * s.oh);
    const int hs = adaptive_start(oy, s.h, s.oh), he = adaptive_end(oy, s.h, s.oh);
    const int ws = adaptive_start(ox, s.w, s.ow), we = adaptive_end(ox, s.w, s.ow);
    const T* xp = x + img * s.h * s.w * c + ch;
    A acc = 0;
    for (int yy = hs; yy < he; ++yy)
      for (int xx = ws; xx < we; ++xx) acc += load_as<A>(xp[(static_cast<std::int64_t>(yy) * s.w + xx) * c]);
    y[i] = store_as<T>(acc / static_cast<A>((he - hs) * (we - ws)));
  }
}

// The gradient reaching input pixel (yy, xx) of a plane from the outputs whose windows cover it. gp:
// the plane's (and channel's) output (0, 0); `step` elements between output pixels (1 in NCHW, C in
// NHWC).
template <class A, class T>
__device__ A adaptive_avg_input_grad(const PoolShape& s, const T* __restrict__ gp, std::int64_t step, int yy, int xx) {
  // Outputs covering yy: start(oy) <= yy < end(oy); scan the small candidate range.
  const int oy0 = (yy * s.oh) / s.h, oy1 = min(((yy + 1) * s.oh + s.h - 1) / s.h, s.oh);
  const int ox0 = (xx * s.ow) / s.w, ox1 = min(((xx + 1) * s.ow + s.w - 1) / s.w, s.ow);
  A acc = 0;
  for (int oy = max(oy0 - 1, 0); oy < oy1; ++oy) {
    const int hs = adaptive_start(oy, s.h, s.oh), he = adaptive_end(oy, s.h, s.oh);
    if (yy < hs || yy >= he) continue;
    for (int ox = max(ox0 - 1, 0); ox < ox1; ++ox) {
      const int ws = adaptive_start(ox, s.w, s.ow), we = adaptive_end(ox, s.w, s.ow);
      if (xx < ws || xx >= we) continue;
      acc += load_as<A>(gp[(static_cast<std::int64_t>(oy) * s.ow + ox) * step]) / static_cast<A>((he - hs) * (we - ws));
    }
  }
  return acc;
}

// Channels-last backward: a thread per input element, channel fastest; the outputs whose windows
// cover the pixel, as adaptive_avg_bwd_kernel finds them.
template <class T>
__global__ void __launch_bounds__(256)
    adaptive_avg_bwd_nhwc_kernel(PoolShape s, std::int64_t c, const T* __restrict__ gy, T* __restrict__ gx) {
  using A = acc_t<T>;
  const std::int64_t total = s.nc * s.h * s.w;
  KILN_GRID_LOOP(i, total) {
    const std::int64_t ch = i % c;
    const int xx = static_cast<int>((i / c) % s.w);
    const int yy = static_cast<int>((i / (c * s.w)) % s.h);
    const std::int64_t img = i / (c * s.w * s.h);
    gx[i] = store_as<T>(adaptive_avg_input_grad<A>(s, gy + img * s.oh * s.ow * c + ch, c, yy, xx));
  }
}

template <class T>
__global__ void __launch_bounds__(256)
    adaptive_avg_bwd_kernel(PoolShape s, const T* __restrict__ gy, T* __restrict__ gx) {
  using A = acc_t<T>;
  const std::int64_t total = s.nc * s.h * s.w;
  KILN_GRID_LOOP(i, total) {
    const int xx = static_cast<int>(i % s.w);
    const int yy = static_cast<int>((i / s.w) % s.h);
    const std::int64_t plane = i / (static_cast<std::int64_t>(s.w) * s.h);
    gx[i] = store_as<T>(adaptive_avg_input_grad<A>(s, gy + plane * s.oh * s.ow, 1, yy, xx));
  }
}

template <class T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <class T>
T* mptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace

void max_pool2d_forward(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dParams& p) {
  PoolShape s = pool_shape(x, y, p);
  const std::int64_t n = y.numel();
  if (n == 0) return;
  Launch l(x);
  KILN_DISPATCH_FLOATING(x.dtype(), "max_pool2d", [&]<class T>() {
    max_pool_fwd_kernel<T>
        <<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(s, cptr<T>(x), mptr<T>(y), mptr<std::int64_t>(indices));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void max_pool2d_backward(const Tensor& grad_y, const Tensor& indices, const Tensor& grad_x, const Pool2dParams& p) {
  PoolShape s = pool_shape(grad_x, grad_y, p);
  const std::int64_t n = grad_x.numel();
  if (n == 0) return;
  Launch l(grad_x);
  KILN_DISPATCH_FLOATING(grad_x.dtype(), "max_pool2d_backward", [&]<class T>() {
    max_pool_bwd_kernel<T><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(
        s, cptr<T>(grad_y), cptr<std::int64_t>(indices), mptr<T>(grad_x));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void avg_pool2d_forward(const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  PoolShape s = pool_shape(x, y, p);
  const std::int64_t n = y.numel();
  if (n == 0) return;
  Launch l(x);
  KILN_DISPATCH_FLOATING(x.dtype(), "avg_pool2d", [&]<class T>() {
    avg_pool_fwd_kernel<T><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(s, cptr<T>(x), mptr<T>(y));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void avg_pool2d_backward(const Tensor& grad_y, const Tensor& grad_x, const Pool2dParams& p) {
  PoolShape s = pool_shape(grad_x, grad_y, p);
  const std::int64_t n = grad_x.numel();
  if (n == 0) return;
  Launch l(grad_x);
  KILN_DISPATCH_FLOATING(grad_x.dtype(), "avg_pool2d_backward", [&]<class T>() {
    avg_pool_bwd_kernel<T><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(s, cptr<T>(grad_y), mptr<T>(grad_x));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void adaptive_avg_pool2d_forward(const Tensor& x, const Tensor& y) {
  PoolShape s = pool_shape(x, y, Pool2dParams{});
  const std::int64_t n = y.numel();
  if (n == 0) return;
  Launch l(x);
  const bool nhwc = is_channels_last_only(x);
  KILN_DISPATCH_FLOATING(x.dtype(), "adaptive_avg_pool2d", [&]<class T>() {
    if (nhwc)
      adaptive_avg_fwd_nhwc_kernel<T>
          <<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(s, x.shape()[1], cptr<T>(x), mptr<T>(y));
    else
      adaptive_avg_fwd_kernel<T><<<grid_for(n * 32, 256, l.index), 256, 0, l.stream>>>(s, cptr<T>(x), mptr<T>(y));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void adaptive_avg_pool2d_backward(const Tensor& grad_y, const Tensor& grad_x) {
  PoolShape s = pool_shape(grad_x, grad_y, Pool2dParams{});
  const std::int64_t n = grad_x.numel();
  if (n == 0) return;
  Launch l(grad_x);
  const bool nhwc = is_channels_last_only(grad_x);
  KILN_DISPATCH_FLOATING(grad_x.dtype(), "adaptive_avg_pool2d_backward", [&]<class T>() {
    if (nhwc)
      adaptive_avg_bwd_nhwc_kernel<T>
          <<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(s, grad_x.shape()[1], cptr<T>(grad_y), mptr<T>(grad_x));
    else
      adaptive_avg_bwd_kernel<T><<<grid_for(n, 256, l.index), 256, 0, l.stream>>>(s, cptr<T>(grad_y), mptr<T>(grad_x));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace kiln::ops::cuda
