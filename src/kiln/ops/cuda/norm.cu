// CUDA batch norm (NCHW / NC, or channels-last NHWC), layer norm and RMS norm.
// Batch norm: per-channel statistics with a (channel, chunk) grid of partial Welford states so that
// few channels still fill the GPU, a per-channel finalize (running-stat update, save_mean/invstd,
// per-channel scale/shift), then one elementwise pass. Backward mirrors it with partial sums of
// dy and dy * xhat. Parameters/statistics may be f32 while x is bf16/f16 (read by runtime dtype).
// Channels-last input is a [rows = N*H*W, C] matrix: its partials come from column-reduction
// kernels (a warp reads 32 adjacent channels of a row), and the elementwise passes run with
// hw = 1 (channel = index % C).
// Layer/RMS norm: a warp per row (rows <= 1024 wide) or a block per row; weight/bias gradients are
// column sums over rows with partial chunks.
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/cuda_kernels.h"
#include "kiln/ops/memory_format.h"

namespace kiln::ops::cuda {

namespace {

struct Welford {
  double mean, m2, n;
};

__device__ __forceinline__ Welford welford_merge(Welford a, Welford b) {
  if (a.n == 0) return b;
  if (b.n == 0) return a;
  double n = a.n + b.n, d = b.mean - a.mean, fb = b.n / n;
  return {a.mean + d * fb, a.m2 + b.m2 + d * d * a.n * fb, n};
}

// x viewed as [N, C, HW]. Grid (C, chunks): each block reduces a contiguous range of the N*HW
// elements of one channel into float partial (sum, sum of squares about a shift) -> Welford.
template <class T>
__global__ void __launch_bounds__(256) bn_stats_kernel(const T* __restrict__ x, std::int64_t n, std::int64_t c,
                                                       std::int64_t hw, std::int64_t chunk, Welford* partial) {
  using A = acc_t<T>;
  const std::int64_t ch = blockIdx.x;
  const std::int64_t total = n * hw;
  const std::int64_t begin = blockIdx.y * chunk;
  const std::int64_t end = begin + chunk < total ? begin + chunk : total;
  // Shifted sums (shift = first element of the chunk) keep the variance accurate in float.
  const A shift = begin < total ? load_as<A>(x[(begin / hw) * c * hw + ch * hw + begin % hw]) : A(0);
  A s = 0, sq = 0;
  std::int64_t cnt = 0;
  if (hw % 4 == 0 && sizeof(T) <= 4) {
    // Walk image by image; inner loop over the plane with plain coalesced loads.
    for (std::int64_t img = begin / hw; img * hw < end; ++img) {
      const std::int64_t lo = img * hw > begin ? img * hw : begin;
      const std::int64_t hi = (img + 1) * hw < end ? (img + 1) * hw : end;
      const T* p = x + img * c * hw + ch * hw - img * hw;
      for (std::int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) {
        A v = load_as<A>(p[k]) - shift;
        s += v;
        sq += v * v;
        ++cnt;
      }
    }
  } else {
    for (std::int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
      A v = load_as<A>(x[(k / hw) * c * hw + ch * hw + k % hw]) - shift;
      s += v;
      sq += v * v;
      ++cnt;
    }
  }
  __shared__ A sh[32];
  __shared__ double shc[32];
  s = block_sum(s, sh);
  sq = block_sum(sq, sh);
  double dc = block_sum(static_cast<double>(cnt), shc);
  if (threadIdx.x == 0) {
    Welford w{0, 0, 0};
    if (dc > 0) {
      double mean_shifted = static_cast<double>(s) / dc;
      double m2 = static_cast<double>(sq) - static_cast<double>(s) * mean_shifted;
      w = {static_cast<double>(shift) + mean_shifted, m2 > 0 ? m2 : 0.0, dc};
    }
    partial[blockIdx.y * gridDim.x + ch] = w;
  }
}

struct BnParams {
  DynPtr weight, bias, running_mean, running_var, save_mean, save_invstd;
  double momentum, eps;
  bool training;
};

// Channels-last statistics: x viewed as [rows, C]. Grid (ceil(C / 32), chunks), block (32, 8):
// thread (tx, ty) walks rows begin + ty, begin + ty + 8, ... of channel 32 * blockIdx.x + tx, so each
// warp load is 32 adjacent channels of one row. Partials as bn_stats_kernel's: [chunk][C].
template <class T>
__global__ void __launch_bounds__(256) bn_stats_nhwc_kernel(const T* __restrict__ x, std::int64_t rows, std::int64_t c,
                                                            std::int64_t chunk, Welford* partial) {
  using A = acc_t<T>;
  const std::int64_t ch = std::int64_t{blockIdx.x} * 32 + threadIdx.x;
  const std::int64_t begin = std::int64_t{blockIdx.y} * chunk;
  const std::int64_t end = begin + chunk < rows ? begin + chunk : rows;
  const bool valid = ch < c;
  const A shift = valid && begin < rows ? load_as<A>(x[begin * c + ch]) : A(0);
  A s = 0, sq = 0;
  int cnt = 0;
  if (valid)
    for (std::int64_t r = begin + threadIdx.y; r < end; r += 8) {
      A v = load_as<A>(x[r * c + ch]) - shift;
      s += v;
      sq += v * v;
      ++cnt;
    }
  __shared__ A sh_s[8][33], sh_sq[8][33];
  __shared__ int sh_n[8][33];
  sh_s[threadIdx.y][threadIdx.x] = s;
  sh_sq[threadIdx.y][threadIdx.x] = sq;
  sh_n[threadIdx.y][threadIdx.x] = cnt;
  __syncthreads();
  if (threadIdx.y != 0 || !valid) return;
  double ts = 0, tsq = 0, tn = 0;
  for (int k = 0; k < 8; ++k) {
    ts += static_cast<double>(sh_s[k][threadIdx.x]);
    tsq += static_cast<double>(sh_sq[k][threadIdx.x]);
    tn += sh_n[k][threadIdx.x];
  }
  Welford w{0, 0, 0};
  if (tn > 0) {
    const double mean_shifted = ts / tn;
    const double m2 = tsq - ts * mean_shifted;
    w = {static_cast<double>(shift) + mean_shifted, m2 > 0 ? m2 : 0.0, tn};
  }
  partial[std::int64_t{blockIdx.y} * c + ch] = w;
}

// Channels-last backward partials: per (channel, chunk) sums of dy and dy * (x - mean), laid out
// as bn_bwd_reduce_kernel's; the same (32, 8) blocks as bn_stats_nhwc_kernel.
template <class T>
__global__ void __launch_bounds__(256)
    bn_bwd_reduce_nhwc_kernel(const T* __restrict__ dy, const T* __restrict__ x, std::int64_t rows, std::int64_t c,
                              std::int64_t chunk, DynPtr save_mean, double2* partial) {
  using A = acc_t<T>;
  const std::int64_t ch = std::int64_t{blockIdx.x} * 32 + threadIdx.x;
  const std::int64_t begin = std::int64_t{blockIdx.y} * chunk;
  const std::int64_t end = begin + chunk < rows ? begin + chunk : rows;
  const bool valid = ch < c;
  A sdy = 0, sdyx = 0;
  if (valid) {
    const A mean = static_cast<A>(load_dyn(save_mean.p, save_mean.t, ch));
    for (std::int64_t r = begin + threadIdx.y; r < end; r += 8) {
      const A g = load_as<A>(dy[r * c + ch]);
      sdy += g;
      sdyx += g * (load_as<A>(x[r * c + ch]) - mean);
    }
  }
  __shared__ A sh_dy[8][33], sh_dyx[8][33];
  sh_dy[threadIdx.y][threadIdx.x] = sdy;
  sh_dyx[threadIdx.y][threadIdx.x] = sdyx;
  __syncthreads();
  if (threadIdx.y != 0 || !valid) return;
  double t_dy = 0, t_dyx = 0;
  for (int k = 0; k < 8; ++k) {
    t_dy += static_cast<double>(sh_dy[k][threadIdx.x]);
    t_dyx += static_cast<double>(sh_dyx[k][threadIdx.x]);
  }
  partial[std::int64_t{blockIdx.y} * c + ch] = make_double2(t_dy, t_dyx);
}

// Chunks of rows for the channels-last reductions: about 8 blocks per SM, at least 64 rows each.
int bn_nhwc_chunks(std::int64_t c, std::int64_t rows, int index) {
  const std::int64_t col_blocks = (c + 31) / 32;
  const std::int64_t target = std::int64_t{device_info(index).sms} * 8;
  std::int64_t chunks = (target + col_blocks - 1) / col_blocks;
  chunks = std::min<std::int64_t>(chunks, std::max<std::int64_t>(1, rows / 64));
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(chunks, 65535)));
}

// One thread per channel: combine partials, update running stats, write scale/shift (scratch in the
// input's accumulation type: an f64 batch norm stays f64).
// C: the per-channel coefficients' type, the input's accumulation type (double for f64 input).
template <class C>
__global__ void bn_finalize_kernel(const Welford* partial, int chunks, std::int64_t c, BnParams p, C* scale, C* shift) {
  const std::int64_t ch = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (ch >= c) return;
  double mean, invstd;
  if (p.training) {
    Welford w = partial[ch];
    for (int k = 1; k < chunks; ++k) w = welford_merge(w, partial[k * c + ch]);
    mean = w.mean;
    double var = w.n > 0 ? w.m2 / w.n : 0.0;
    invstd = 1.0 / sqrt(var + p.eps);
    if (p.save_mean.p) store_dyn(p.save_mean.p, p.save_mean.t, ch, mean);
    if (p.save_invstd.p) store_dyn(p.save_invstd.p, p.save_invstd.t, ch, invstd);
    if (p.running_mean.p) {
      double rm = load_dyn(p.running_mean.p, p.running_mean.t, ch);
      store_dyn(p.running_mean.p, p.running_mean.t, ch, (1 - p.momentum) * rm + p.momentum * mean);
    }
    if (p.running_var.p) {
      double unbiased = w.n > 1 ? w.m2 / (w.n - 1) : var;
      double rv = load_dyn(p.running_var.p, p.running_var.t, ch);
      store_dyn(p.running_var.p, p.running_var.t, ch, (1 - p.momentum) * rv + p.momentum * unbiased);
    }
  } else {
    mean = load_dyn(p.running_mean.p, p.running_mean.t, ch);
    invstd = 1.0 / sqrt(load_dyn(p.running_var.p, p.running_var.t, ch) + p.eps);
  }
  double g = p.weight.p ? load_dyn(p.weight.p, p.weight.t, ch) : 1.0;
  double b = p.bias.p ? load_dyn(p.bias.p, p.bias.t, ch) : 0.0;
  scale[ch] = static_cast<C>(g * invstd);
  shift[ch] = static_cast<C>(b - mean * g * invstd);
}

// (i / hw) % c with 32-bit division when everything fits (int64 division is ~10x slower).
__device__ __forceinline__ std::int64_t channel_of(std::int64_t i, std::int64_t hw, std::int64_t c, bool small) {
  if (small) return (static_cast<std::uint32_t>(i) / static_cast<std::uint32_t>(hw)) % static_cast<std::uint32_t>(c);
  return (i / hw) % c;
}

// y = x * scale[c] + shift[c]; grid-stride over all elements.
template <class T>
__global__ void __launch_bounds__(256)
    bn_apply_kernel(const T* __restrict__ x, T* __restrict__ y, std::int64_t total, std::int64_t c, std::int64_t hw,
                    const acc_t<T>* scale, const acc_t<T>* shift, bool small) {
  using A = acc_t<T>;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    const std::int64_t ch = channel_of(i, hw, c, small);
    y[i] = store_as<T>(load_as<A>(x[i]) * scale[ch] + shift[ch]);
  }
}

// Backward partials: per (channel, chunk) sums of dy and dy * (x - mean).
template <class T>
__global__ void __launch_bounds__(256)
    bn_bwd_reduce_kernel(const T* __restrict__ dy, const T* __restrict__ x, std::int64_t n, std::int64_t c,
                         std::int64_t hw, std::int64_t chunk, DynPtr save_mean, double2* partial) {
  using A = acc_t<T>;
  const std::int64_t ch = blockIdx.x;
  const std::int64_t total = n * hw;
  const std::int64_t begin = blockIdx.y * chunk;
  const std::int64_t end = begin + chunk < total ? begin + chunk : total;
  const A mean = static_cast<A>(load_dyn(save_mean.p, save_mean.t, ch));
  A sdy = 0, sdyx = 0;
  for (std::int64_t img = begin / hw; img * hw < end; ++img) {
    const std::int64_t lo = img * hw > begin ? img * hw : begin;
    const std::int64_t hi = (img + 1) * hw < end ? (img + 1) * hw : end;
    const std::int64_t base = img * c * hw + ch * hw - img * hw;
    for (std::int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) {
      A g = load_as<A>(dy[base + k]);
      sdy += g;
      sdyx += g * (load_as<A>(x[base + k]) - mean);
    }
  }
  __shared__ A sh[32];
  sdy = block_sum(sdy, sh);
  sdyx = block_sum(sdyx, sh);
  if (threadIdx.x == 0) partial[blockIdx.y * gridDim.x + ch] = make_double2(sdy, sdyx);
}

struct BnBwdParams {
  DynPtr weight, save_mean, save_invstd, grad_w, grad_b;
  double count;
};

// Per channel: grad_w = sum(dy * xhat), grad_b = sum(dy); coefficients for grad_x:
// grad_x = k1 * dy + k2 * x + k3.
template <class C>
__global__ void bn_bwd_finalize_kernel(const double2* partial, int chunks, std::int64_t c, BnBwdParams p, C* coef) {
  const std::int64_t ch = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (ch >= c) return;
  double sdy = 0, sdyx = 0;
  for (int k = 0; k < chunks; ++k) {
    double2 v = partial[k * c + ch];
    sdy += v.x;
    sdyx += v.y;
  }
  const double mean = load_dyn(p.save_mean.p, p.save_mean.t, ch);
  const double invstd = load_dyn(p.save_invstd.p, p.save_invstd.t, ch);
  const double g = p.weight.p ? load_dyn(p.weight.p, p.weight.t, ch) : 1.0;
  if (p.grad_w.p) store_dyn(p.grad_w.p, p.grad_w.t, ch, sdyx * invstd);
  if (p.grad_b.p) store_dyn(p.grad_b.p, p.grad_b.t, ch, sdy);
  // grad_x = g*invstd * (dy - sdy/M - (x-mean)*invstd^2 * sdyx/M)
  const double k1 = g * invstd;
  const double k2 = -g * invstd * invstd * invstd * sdyx / p.count;
  const double k3 = -k1 * sdy / p.count - k2 * mean;
  coef[ch] = static_cast<C>(k1);
  coef[c + ch] = static_cast<C>(k2);
  coef[2 * c + ch] = static_cast<C>(k3);
}

template <class T>
__global__ void __launch_bounds__(256)
    bn_bwd_apply_kernel(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx, std::int64_t total,
                        std::int64_t c, std::int64_t hw, const acc_t<T>* coef, bool small) {
  using A = acc_t<T>;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    const std::int64_t ch = channel_of(i, hw, c, small);
    dx[i] = store_as<T>(coef[ch] * load_as<A>(dy[i]) + coef[c + ch] * load_as<A>(x[i]) + coef[2 * c + ch]);
  }
}

int bn_chunks(std::int64_t c, std::int64_t per_channel, int index) {
  const std::int64_t target = device_info(index).sms * 4;
  std::int64_t chunks = (target + c - 1) / c;
  chunks = std::min<std::int64_t>(chunks, std::max<std::int64_t>(1, per_channel / 2048));
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(chunks, 65535)));
}

// ---- layer norm / RMS norm ----------------------------------------------------------------------

// `group` threads per row (32 or 256). Two passes over the row (the second hits L1/L2).
template <class T, bool kRms>
__global__ void __launch_bounds__(256)
    row_norm_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                        acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out, std::int64_t rows,
                        std::int64_t d, double eps, int group) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / group) + threadIdx.x / group;
  const int lane = threadIdx.x % group;
  const bool active = row < rows;
  const T* xr = x + (active ? row : 0) * d;
  A s = 0;
  if (active)
    for (std::int64_t k = lane; k < d; k += group) {
      A v = load_as<A>(xr[k]);
      s += kRms ? v * v : v;
    }
  s = group == 32 ? warp_reduce(s, [](A a, A c) { return a + c; }) : block_sum(s, sh);
  const A mean = kRms ? A(0) : s / static_cast<A>(d);
  A var;
  if (kRms) {
    var = s / static_cast<A>(d);
  } else {
    A q = 0;
    if (active)
      for (std::int64_t k = lane; k < d; k += group) {
        A v = load_as<A>(xr[k]) - mean;
        q += v * v;
      }
    q = group == 32 ? warp_reduce(q, [](A a, A c) { return a + c; }) : block_sum(q, sh);
    var = q / static_cast<A>(d);
  }
  const A rstd = A(1) / sqrt(var + static_cast<A>(eps));
  if (!active) return;
  T* yr = y + row * d;
  for (std::int64_t k = lane; k < d; k += group) {
    A v = (load_as<A>(xr[k]) - mean) * rstd;
    if (w) v *= load_as<A>(w[k]);
    if (!kRms && b) v += load_as<A>(b[k]);
    yr[k] = store_as<T>(v);
  }
  if (lane == 0) {
    if (!kRms && mean_out) mean_out[row] = mean;
    if (rstd_out) rstd_out[row] = rstd;
  }
}

// grad_x per row: g = dy * w, xhat = (x - mean) * rstd,
// layer norm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); RMS: dx = rstd * (g - xhat * mean(g * xhat)).
template <class T, bool kRms>
__global__ void __launch_bounds__(256)
    row_norm_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                        const acc_t<T>* __restrict__ mean_in, const acc_t<T>* __restrict__ rstd_in, T* __restrict__ dx,
                        std::int64_t rows, std::int64_t d, int group) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / group) + threadIdx.x / group;
  const int lane = threadIdx.x % group;
  const bool active = row < rows;
  const std::int64_t r = active ? row : 0;
  const T* xr = x + r * d;
  const T* gr = dy + r * d;
  const A mean = kRms ? A(0) : mean_in[r];
  const A rstd = rstd_in[r];
  A sg = 0, sgx = 0;
  if (active)
    for (std::int64_t k = lane; k < d; k += group) {
      A g = load_as<A>(gr[k]) * (w ? load_as<A>(w[k]) : A(1));
      A xh = (load_as<A>(xr[k]) - mean) * rstd;
      sg += g;
      sgx += g * xh;
    }
  if (group == 32) {
    sg = warp_reduce(sg, [](A a, A c) { return a + c; });
    sgx = warp_reduce(sgx, [](A a, A c) { return a + c; });
  } else {
    sg = block_sum(sg, sh);
    sgx = block_sum(sgx, sh);
  }
  if (!active) return;
  const A mg = kRms ? A(0) : sg / static_cast<A>(d), mgx = sgx / static_cast<A>(d);
  T* dr = dx + r * d;
  for (std::int64_t k = lane; k < d; k += group) {
    A g = load_as<A>(gr[k]) * (w ? load_as<A>(w[k]) : A(1));
    A xh = (load_as<A>(xr[k]) - mean) * rstd;
    dr[k] = store_as<T>(rstd * (g - mg - xh * mgx));
  }
}

// Column sums over rows of dy * xhat (-> grad_w) and dy (-> grad_b): block (32, 8), grid
// (d / 32, chunks) into partials of the accumulation type, then a finalize kernel.
template <class T, bool kRms>
__global__ void __launch_bounds__(256)
    row_norm_wgrad_kernel(const T* __restrict__ dy, const T* __restrict__ x, const acc_t<T>* __restrict__ mean_in,
                          const acc_t<T>* __restrict__ rstd_in, std::int64_t rows, std::int64_t d, std::int64_t chunk,
                          acc_t<T>* partial) {
  using A = acc_t<T>;
  __shared__ A shw[8][33], shb[8][33];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t begin = blockIdx.y * chunk;
  const std::int64_t end = begin + chunk < rows ? begin + chunk : rows;
  A sw = 0, sb = 0;
  if (col < d)
    for (std::int64_t r = begin + threadIdx.y; r < end; r += 8) {
      A g = load_as<A>(dy[r * d + col]);
      A xh = (load_as<A>(x[r * d + col]) - (kRms ? A(0) : mean_in[r])) * rstd_in[r];
      sw += g * xh;
      sb += g;
    }
  shw[threadIdx.y][threadIdx.x] = sw;
  shb[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && col < d) {
    for (int k = 1; k < 8; ++k) {
      sw += shw[k][threadIdx.x];
      sb += shb[k][threadIdx.x];
    }
    partial[(blockIdx.y * d + col) * 2] = sw;
    partial[(blockIdx.y * d + col) * 2 + 1] = sb;
  }
}

template <class A>
__global__ void row_norm_wgrad_finalize(const A* partial, int chunks, std::int64_t d, DynPtr gw, DynPtr gb) {
  const std::int64_t col = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (col >= d) return;
  double sw = 0, sb = 0;
  for (int k = 0; k < chunks; ++k) {
    sw += partial[(k * d + col) * 2];
    sb += partial[(k * d + col) * 2 + 1];
  }
  if (gw.p) store_dyn(gw.p, gw.t, col, sw);
  if (gb.p) store_dyn(gb.p, gb.t, col, sb);
}

template <class T>
const T* opt_ptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}
// Layer/RMS-norm statistics are in the accumulation type: f64 for an f64 input, else f32.
template <class A>
A* opt_stat(const Tensor& t) {
  if (!t.defined()) return nullptr;
  constexpr DType want = std::is_same_v<A, double> ? DType::F64 : DType::F32;
  KILN_CHECK(t.dtype() == want, "norm: statistics must be {}, got {}", dtype_name(want), t.describe());
  return static_cast<A*>(t.data_ptr());
}

template <bool kRms>
void row_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                      const Tensor& mean, const Tensor& rstd) {
  const std::int64_t d = x.shape().back();
  const std::int64_t rows = d ? x.numel() / d : 0;
  if (rows == 0) return;
  Launch l(x);
  const int group = d <= 1024 ? 32 : 256;
  const std::int64_t blocks = (rows + 256 / group - 1) / (256 / group);
  KILN_DISPATCH_FLOATING(x.dtype(), kRms ? "rms_norm" : "layer_norm", [&]<class T>() {
    row_norm_fwd_kernel<T, kRms><<<static_cast<unsigned>(blocks), 256, 0, l.stream>>>(
        static_cast<const T*>(x.data_ptr()), opt_ptr<T>(w), opt_ptr<T>(b), static_cast<T*>(y.data_ptr()),
        opt_stat<acc_t<T>>(mean), opt_stat<acc_t<T>>(rstd), rows, d, eps, group);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

template <bool kRms>
void row_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                       const Tensor& grad_x, const Tensor& grad_w, const Tensor& grad_b) {
  const std::int64_t d = x.shape().back();
  const std::int64_t rows = d ? x.numel() / d : 0;
  Launch l(x);
  if (rows == 0) {
    if (grad_w.defined()) KILN_CUDA_CHECK(cudaMemsetAsync(grad_w.data_ptr(), 0, grad_w.nbytes(), l.stream));
    if (grad_b.defined()) KILN_CUDA_CHECK(cudaMemsetAsync(grad_b.data_ptr(), 0, grad_b.nbytes(), l.stream));
    return;
  }
  KILN_DISPATCH_FLOATING(x.dtype(), kRms ? "rms_norm_backward" : "layer_norm_backward", [&]<class T>() {
    using A = acc_t<T>;
    const A* mp = kRms ? nullptr : opt_stat<A>(mean);
    const A* rp = opt_stat<A>(rstd);
    const T* dyp = static_cast<const T*>(grad_y.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    if (grad_x.defined()) {
      const int group = d <= 1024 ? 32 : 256;
      const std::int64_t blocks = (rows + 256 / group - 1) / (256 / group);
      row_norm_bwd_kernel<T, kRms><<<static_cast<unsigned>(blocks), 256, 0, l.stream>>>(
          dyp, xp, opt_ptr<T>(w), mp, rp, static_cast<T*>(grad_x.data_ptr()), rows, d, group);
      KILN_CUDA_CHECK_LAUNCH();
    }
    if (grad_w.defined() || grad_b.defined()) {
      const std::int64_t bx = (d + 31) / 32;
      std::int64_t chunks = std::max<std::int64_t>(1, device_info(l.index).sms * 4 / bx);
      chunks = std::min<std::int64_t>(chunks, std::max<std::int64_t>(1, rows / 64));
      chunks = std::min<std::int64_t>(chunks, 65535);
      const std::int64_t chunk = (rows + chunks - 1) / chunks;
      chunks = (rows + chunk - 1) / chunk;
      Scratch partial(sizeof(A) * 2 * d * chunks, l.index);
      row_norm_wgrad_kernel<T, kRms>
          <<<dim3(static_cast<unsigned>(bx), static_cast<unsigned>(chunks)), dim3(32, 8), 0, l.stream>>>(
              dyp, xp, mp, rp, rows, d, chunk, partial.as<A>());
      KILN_CUDA_CHECK_LAUNCH();
      row_norm_wgrad_finalize<<<static_cast<unsigned>((d + 255) / 256), 256, 0, l.stream>>>(
          partial.as<A>(), static_cast<int>(chunks), d, dyn(grad_w), dyn(grad_b));
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace

void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                        const Tensor& running_var, bool training, double momentum, double eps, const Tensor& y,
                        const Tensor& save_mean, const Tensor& save_invstd) {
  const bool nhwc = is_channels_last_only(x);
  const std::int64_t c = x.shape()[1];
  // Channels-last is [N*H*W, C] with hw = 1 for the elementwise pass.
  const std::int64_t n = nhwc ? x.numel() / std::max<std::int64_t>(1, c) : x.shape()[0];
  const std::int64_t hw = nhwc ? 1 : x.numel() / std::max<std::int64_t>(1, n * c);
  if (c == 0) return;
  Launch l(x);
  KILN_CHECK(training || (running_mean.defined() && running_var.defined()),
             "batch_norm: evaluation needs running statistics");
  BnParams p{dyn(weight), dyn(bias), dyn(running_mean), dyn(running_var), dyn(save_mean), dyn(save_invstd),
             momentum,    eps,       training};
  KILN_DISPATCH_FLOATING(x.dtype(), "batch_norm", [&]<class T>() {
    using A = acc_t<T>;
    Scratch coef(sizeof(A) * 2 * c, l.index);
    A* scale = coef.as<A>();
    A* shift = scale + c;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const int stat_chunks = nhwc ? bn_nhwc_chunks(c, n, l.index) : bn_chunks(c, n * hw, l.index);
    int chunks = 1;
    Scratch partial(training ? sizeof(Welford) * c * stat_chunks : 0, l.index);
    if (training) {
      chunks = stat_chunks;
      const std::int64_t chunk = (n * hw + chunks - 1) / chunks;
      if (nhwc)
        bn_stats_nhwc_kernel<T><<<dim3(static_cast<unsigned>((c + 31) / 32), chunks), dim3(32, 8), 0, l.stream>>>(
            xp, n, c, chunk, partial.as<Welford>());
      else
        bn_stats_kernel<T>
            <<<dim3(static_cast<unsigned>(c), chunks), 256, 0, l.stream>>>(xp, n, c, hw, chunk, partial.as<Welford>());
      KILN_CUDA_CHECK_LAUNCH();
    }
    bn_finalize_kernel<<<static_cast<unsigned>((c + 127) / 128), 128, 0, l.stream>>>(partial.as<Welford>(), chunks, c,
                                                                                     p, scale, shift);
    KILN_CUDA_CHECK_LAUNCH();
    const std::int64_t total = x.numel();
    if (total)
      bn_apply_kernel<T><<<grid_for(total, 256, l.index), 256, 0, l.stream>>>(
          xp, static_cast<T*>(y.data_ptr()), total, c, hw, scale, shift, total < (std::int64_t{1} << 31));
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                         const Tensor& save_invstd, const Tensor& grad_x, const Tensor& grad_w, const Tensor& grad_b) {
  const bool nhwc = is_channels_last_only(x);
  const std::int64_t c = x.shape()[1];
  const std::int64_t n = nhwc ? x.numel() / std::max<std::int64_t>(1, c) : x.shape()[0];
  const std::int64_t hw = nhwc ? 1 : x.numel() / std::max<std::int64_t>(1, n * c);
  if (c == 0) return;
  Launch l(x);
  KILN_DISPATCH_FLOATING(x.dtype(), "batch_norm_backward", [&]<class T>() {
    const T* dyp = static_cast<const T*>(grad_y.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    const int chunks = nhwc ? bn_nhwc_chunks(c, n, l.index) : bn_chunks(c, n * hw, l.index);
    const std::int64_t chunk = (n * hw + chunks - 1) / chunks;
    Scratch partial(sizeof(double2) * c * chunks, l.index);
    using A = acc_t<T>;
    Scratch coef(sizeof(A) * 3 * c, l.index);
    if (nhwc)
      bn_bwd_reduce_nhwc_kernel<T><<<dim3(static_cast<unsigned>((c + 31) / 32), chunks), dim3(32, 8), 0, l.stream>>>(
          dyp, xp, n, c, chunk, dyn(save_mean), partial.as<double2>());
    else
      bn_bwd_reduce_kernel<T><<<dim3(static_cast<unsigned>(c), chunks), 256, 0, l.stream>>>(
          dyp, xp, n, c, hw, chunk, dyn(save_mean), partial.as<double2>());
    KILN_CUDA_CHECK_LAUNCH();
    BnBwdParams bp{dyn(weight), dyn(save_mean), dyn(save_invstd),
                   dyn(grad_w), dyn(grad_b),    static_cast<double>(n * hw)};
    bn_bwd_finalize_kernel<<<static_cast<unsigned>((c + 127) / 128), 128, 0, l.stream>>>(partial.as<double2>(), chunks,
                                                                                         c, bp, coef.as<A>());
    KILN_CUDA_CHECK_LAUNCH();
    const std::int64_t total = x.numel();
    if (grad_x.defined() && total) {
      bn_bwd_apply_kernel<T><<<grid_for(total, 256, l.index), 256, 0, l.stream>>>(
          dyp, xp, static_cast<T*>(grad_x.data_ptr()), total, c, hw, coef.as<A>(), total < (std::int64_t{1} << 31));
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
}

void layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd) {
  row_norm_forward<false>(x, w, b, eps, y, mean, rstd);
}

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                         const Tensor& grad_x, const Tensor& grad_w, const Tensor& grad_b) {
  row_norm_backward<false>(grad_y, x, w, mean, rstd, grad_x, grad_w, grad_b);
}

void rms_norm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) {
  row_norm_forward<true>(x, w, Tensor(), eps, y, Tensor(), rstd);
}

void rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& grad_x,
                       const Tensor& grad_w) {
  row_norm_backward<true>(grad_y, x, w, Tensor(), rstd, grad_x, grad_w, Tensor());
}

}  // namespace kiln::ops::cuda
