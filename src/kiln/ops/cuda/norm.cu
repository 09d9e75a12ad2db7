// CUDA batch norm (NCHW / NC, or channels-last NHWC), layer norm and RMS norm.
// Batch norm: per-channel statistics with a (channel, chunk) grid of partial Welford states so that
// few channels still fill the GPU, a per-channel finalize (running-stat update, save_mean/invstd,
// per-channel scale/shift), then one elementwise pass. Backward mirrors it with partial sums of
// dy and dy * xhat. Parameters/statistics may be f32 while x is bf16/f16 (read by runtime dtype).
// Channels-last input is a [rows = N*H*W, C] matrix: its partials come from column-reduction
// kernels, and the elementwise passes run with hw = 1 (channel = index % C). When C and the
// pointers allow, every channels-last pass moves 16-byte packs of adjacent channels (the *_vec
// kernels); otherwise a warp reads 32 adjacent channels of a row, an element per thread.
// The fused epilogue (ResNet's blocks) adds a residual and applies a ReLU in the elementwise pass;
// its backward masks dy by the output (> 0) inside the reduction and the elementwise pass.
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

// The fused epilogue's ReLU: NaN stays NaN (NaN < 0 is false).
template <class A>
__device__ __forceinline__ A relu_keep_nan(A v) {
  return v < A(0) ? A(0) : v;
}

// The gradient through the fused ReLU: dy where the output y is > 0 (y null: no ReLU, dy itself).
template <class A, class T>
__device__ __forceinline__ A relu_masked(T dy, const T* __restrict__ y, std::int64_t i) {
  if (y && !(load_as<A>(y[i]) > A(0))) return A(0);
  return load_as<A>(dy);
}

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
// y (or null): the fused ReLU's output; the gradient is dy where y > 0.
template <class T>
__global__ void __launch_bounds__(256)
    bn_bwd_reduce_nhwc_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y,
                              std::int64_t rows, std::int64_t c, std::int64_t chunk, DynPtr save_mean,
                              double2* partial) {
  using A = acc_t<T>;
  const std::int64_t ch = std::int64_t{blockIdx.x} * 32 + threadIdx.x;
  const std::int64_t begin = std::int64_t{blockIdx.y} * chunk;
  const std::int64_t end = begin + chunk < rows ? begin + chunk : rows;
  const bool valid = ch < c;
  A sdy = 0, sdyx = 0;
  if (valid) {
    const A mean = static_cast<A>(load_dyn(save_mean.p, save_mean.t, ch));
    for (std::int64_t r = begin + threadIdx.y; r < end; r += 8) {
      const A g = relu_masked<A>(dy[r * c + ch], y, r * c + ch);
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
// A block per channel: its threads merge every 256th chunk's partial, each warp merges its lanes', and
// the first thread the warps' (hundreds of chunks a channel: one thread walking them all in turn took
// tens of microseconds, a warp still 15).
constexpr int kFinalizeThreads = 256;

__device__ __forceinline__ Welford welford_warp_merge(Welford w) {
  for (int off = 16; off > 0; off >>= 1) {
    Welford o{__shfl_down_sync(0xffffffffu, w.mean, off), __shfl_down_sync(0xffffffffu, w.m2, off),
              __shfl_down_sync(0xffffffffu, w.n, off)};
    w = welford_merge(w, o);
  }
  return w;
}

template <class C>
__global__ void __launch_bounds__(kFinalizeThreads)
    bn_finalize_kernel(const Welford* partial, int chunks, std::int64_t c, BnParams p, C* scale, C* shift) {
  const std::int64_t ch = blockIdx.x;
  double mean, invstd;
  if (p.training) {
    Welford w{0, 0, 0};
    for (int k = threadIdx.x; k < chunks; k += kFinalizeThreads) w = welford_merge(w, partial[k * c + ch]);
    w = welford_warp_merge(w);
    __shared__ Welford warps[kFinalizeThreads / 32];
    if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = w;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int k = 1; k < kFinalizeThreads / 32; ++k) w = welford_merge(w, warps[k]);
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
    if (threadIdx.x != 0) return;
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

// y = relu?(x * scale[c] + shift[c] + res?); grid-stride over all elements.
template <class T>
__global__ void __launch_bounds__(256)
    bn_apply_kernel(const T* __restrict__ x, const T* __restrict__ res, bool relu, T* __restrict__ y,
                    std::int64_t total, std::int64_t c, std::int64_t hw, const acc_t<T>* scale, const acc_t<T>* shift,
                    bool small) {
  using A = acc_t<T>;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    const std::int64_t ch = channel_of(i, hw, c, small);
    A v = load_as<A>(x[i]) * scale[ch] + shift[ch];
    if (res) v += load_as<A>(res[i]);
    y[i] = store_as<T>(relu ? relu_keep_nan(v) : v);
  }
}

// ---- channels-last in 16-byte packs -------------------------------------------------------------
// x viewed as [rows, C] with C % V == 0 (V = 16 / sizeof(T)) and 16-byte aligned pointers: a thread
// takes a pack of V adjacent channels of a row, so a warp reads whole 16-byte words, several rows at
// once when C is narrow (C = 64 in bf16: 8 packs a row, 4 rows a warp). Block (PX, 256 / PX): PX
// packs of channels (a power of two <= 32) by 256 / PX rows; grid (ceil(P / PX), chunks of rows).
constexpr int kBnThreads = 256;

inline int bn_vec_packs_per_block(std::int64_t packs) {
  int px = 1;
  while (px < 32 && px * 2 <= packs) px *= 2;
  return px;
}

// Chunks of rows for the packed reductions: about 8 blocks per SM, at least 256 rows each.
int bn_vec_chunks(std::int64_t col_blocks, std::int64_t rows, int index) {
  const std::int64_t target = std::int64_t{device_info(index).sms} * 8;
  std::int64_t chunks = (target + col_blocks - 1) / col_blocks;
  chunks = std::min<std::int64_t>(chunks, std::max<std::int64_t>(1, rows / 256));
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(chunks, 65535)));
}

// Per-(chunk, channel) Welford partials, as bn_stats_nhwc_kernel's.
template <class T, int V>
__global__ void __launch_bounds__(kBnThreads)
    bn_stats_nhwc_vec_kernel(const T* __restrict__ x, std::int64_t rows, std::int64_t c, std::int64_t chunk, int px,
                             Welford* partial) {
  using A = acc_t<T>;
  using Pack = Vec<T, V>;
  const int tx = threadIdx.x % px, ty = threadIdx.x / px, py = kBnThreads / px;
  const std::int64_t packs = c / V, q = std::int64_t{blockIdx.x} * px + tx;
  const std::int64_t begin = std::int64_t{blockIdx.y} * chunk;
  const std::int64_t end = begin + chunk < rows ? begin + chunk : rows;
  const bool valid = q < packs && begin < end;
  const auto* xp = reinterpret_cast<const Pack*>(x);
  A shift[V], s[V], sq[V];
  {
    Pack p0 = valid ? xp[begin * packs + q] : Pack{};
#pragma unroll
    for (int j = 0; j < V; ++j) {
      shift[j] = valid ? load_as<A>(p0.v[j]) : A(0);
      s[j] = sq[j] = A(0);
    }
  }
  int cnt = 0;
  if (valid)
    for (std::int64_t r = begin + ty; r < end; r += py) {
      const Pack p = xp[r * packs + q];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A v = load_as<A>(p.v[j]) - shift[j];
        s[j] += v;
        sq[j] += v * v;
      }
      ++cnt;
    }
  __shared__ A sh_s[kBnThreads * V], sh_sq[kBnThreads * V];
  __shared__ int sh_n[kBnThreads];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    sh_s[ty * px * V + tx * V + j] = s[j];
    sh_sq[ty * px * V + tx * V + j] = sq[j];
  }
  if (tx == 0) sh_n[ty] = cnt;
  __syncthreads();
  const int cb = threadIdx.x;  // one thread per channel of the block's px * V
  if (cb >= px * V) return;
  const std::int64_t ch = std::int64_t{blockIdx.x} * px * V + cb;
  if (ch >= c) return;
  double ts = 0, tsq = 0, tn = 0;
  for (int k = 0; k < py; ++k) {
    ts += static_cast<double>(sh_s[k * px * V + cb]);
    tsq += static_cast<double>(sh_sq[k * px * V + cb]);
    tn += sh_n[k];
  }
  Welford w{0, 0, 0};
  if (tn > 0) {
    const double mean_shifted = ts / tn;
    const double m2 = tsq - ts * mean_shifted;
    const double sh = static_cast<double>(load_as<A>(x[begin * c + ch]));
    w = {sh + mean_shifted, m2 > 0 ? m2 : 0.0, tn};
  }
  partial[std::int64_t{blockIdx.y} * c + ch] = w;
}

// Backward partials per (chunk, channel): sums of g and g * (x - mean), g = dy masked by y > 0 when
// y is given (the fused ReLU); laid out as bn_bwd_reduce_kernel's.
template <class T, int V>
__global__ void __launch_bounds__(kBnThreads)
    bn_bwd_reduce_nhwc_vec_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y,
                                  std::int64_t rows, std::int64_t c, std::int64_t chunk, int px, DynPtr save_mean,
                                  double2* partial) {
  using A = acc_t<T>;
  using Pack = Vec<T, V>;
  const int tx = threadIdx.x % px, ty = threadIdx.x / px, py = kBnThreads / px;
  const std::int64_t packs = c / V, q = std::int64_t{blockIdx.x} * px + tx;
  const std::int64_t begin = std::int64_t{blockIdx.y} * chunk;
  const std::int64_t end = begin + chunk < rows ? begin + chunk : rows;
  const bool valid = q < packs;
  const auto* dyp = reinterpret_cast<const Pack*>(dy);
  const auto* xp = reinterpret_cast<const Pack*>(x);
  const auto* yp = reinterpret_cast<const Pack*>(y);
  A mean[V], sdy[V], sdyx[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    mean[j] = valid ? static_cast<A>(load_dyn(save_mean.p, save_mean.t, q * V + j)) : A(0);
    sdy[j] = sdyx[j] = A(0);
  }
  if (valid)
    for (std::int64_t r = begin + ty; r < end; r += py) {
      const Pack pd = dyp[r * packs + q], px_ = xp[r * packs + q];
      Pack pm{};
      if (yp) pm = yp[r * packs + q];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A g = (yp && !(load_as<A>(pm.v[j]) > A(0))) ? A(0) : load_as<A>(pd.v[j]);
        sdy[j] += g;
        sdyx[j] += g * (load_as<A>(px_.v[j]) - mean[j]);
      }
    }
  __shared__ A sh_dy[kBnThreads * V], sh_dyx[kBnThreads * V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    sh_dy[ty * px * V + tx * V + j] = sdy[j];
    sh_dyx[ty * px * V + tx * V + j] = sdyx[j];
  }
  __syncthreads();
  const int cb = threadIdx.x;
  if (cb >= px * V) return;
  const std::int64_t ch = std::int64_t{blockIdx.x} * px * V + cb;
  if (ch >= c) return;
  double t_dy = 0, t_dyx = 0;
  for (int k = 0; k < py; ++k) {
    t_dy += static_cast<double>(sh_dy[k * px * V + cb]);
    t_dyx += static_cast<double>(sh_dyx[k * px * V + cb]);
  }
  partial[std::int64_t{blockIdx.y} * c + ch] = make_double2(t_dy, t_dyx);
}

// y = relu?(x * scale + shift + res?) a pack at a time; channel of a pack = (pack % (C / V)) * V.
template <class T, int V>
__global__ void __launch_bounds__(kBnThreads)
    bn_apply_nhwc_vec_kernel(const T* __restrict__ x, const T* __restrict__ res, bool relu, T* __restrict__ y,
                             std::int64_t vectors, std::int64_t packs, const acc_t<T>* scale, const acc_t<T>* shift) {
  using A = acc_t<T>;
  using Pack = Vec<T, V>;
  const auto* xp = reinterpret_cast<const Pack*>(x);
  const auto* rp = reinterpret_cast<const Pack*>(res);
  auto* yp = reinterpret_cast<Pack*>(y);
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < vectors;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t ch = (i % packs) * V;
    const Pack p = xp[i];
    Pack r{};
    if (rp) r = rp[i];
    Pack o;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      A v = load_as<A>(p.v[j]) * scale[ch + j] + shift[ch + j];
      if (rp) v += load_as<A>(r.v[j]);
      o.v[j] = store_as<T>(relu ? relu_keep_nan(v) : v);
    }
    yp[i] = o;
  }
}

// dx = k1 * g + k2 * x + k3 a pack at a time, g = dy masked by y > 0 when y is given; gres (or null)
// receives g (the residual's gradient).
template <class T, int V>
__global__ void __launch_bounds__(kBnThreads)
    bn_bwd_apply_nhwc_vec_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y,
                                 T* __restrict__ dx, T* __restrict__ gres, std::int64_t vectors, std::int64_t packs,
                                 std::int64_t c, const acc_t<T>* coef) {
  using A = acc_t<T>;
  using Pack = Vec<T, V>;
  const auto* dyp = reinterpret_cast<const Pack*>(dy);
  const auto* xp = reinterpret_cast<const Pack*>(x);
  const auto* yp = reinterpret_cast<const Pack*>(y);
  auto* dxp = reinterpret_cast<Pack*>(dx);
  auto* grp = reinterpret_cast<Pack*>(gres);
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < vectors;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t ch = (i % packs) * V;
    Pack g = dyp[i];
    if (yp) {
      const Pack m = yp[i];
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (!(load_as<A>(m.v[j]) > A(0))) g.v[j] = store_as<T>(A(0));
    }
    if (grp) grp[i] = g;
    if (!dxp) continue;
    const Pack p = xp[i];
    Pack o;
#pragma unroll
    for (int j = 0; j < V; ++j)
      o.v[j] =
          store_as<T>(coef[ch + j] * load_as<A>(g.v[j]) + coef[c + ch + j] * load_as<A>(p.v[j]) + coef[2 * c + ch + j]);
    dxp[i] = o;
  }
}

// Backward partials: per (channel, chunk) sums of dy and dy * (x - mean).
template <class T>
__global__ void __launch_bounds__(256)
    bn_bwd_reduce_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y, std::int64_t n,
                         std::int64_t c, std::int64_t hw, std::int64_t chunk, DynPtr save_mean, double2* partial) {
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
      A g = relu_masked<A>(dy[base + k], y, base + k);
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
// A block per channel, as bn_finalize_kernel.
template <class C>
__global__ void __launch_bounds__(kFinalizeThreads)
    bn_bwd_finalize_kernel(const double2* partial, int chunks, std::int64_t c, BnBwdParams p, C* coef) {
  const std::int64_t ch = blockIdx.x;
  double sdy = 0, sdyx = 0;
  for (int k = threadIdx.x; k < chunks; k += kFinalizeThreads) {
    double2 v = partial[k * c + ch];
    sdy += v.x;
    sdyx += v.y;
  }
  __shared__ double sh[32];
  sdy = block_sum(sdy, sh);
  sdyx = block_sum(sdyx, sh);
  if (threadIdx.x != 0) return;
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

// dx (or null) = k1 * g + k2 * x + k3, g = dy masked by y > 0 when y is given; gres (or null) receives g.
template <class T>
__global__ void __launch_bounds__(256)
    bn_bwd_apply_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ dx,
                        T* __restrict__ gres, std::int64_t total, std::int64_t c, std::int64_t hw, const acc_t<T>* coef,
                        bool small) {
  using A = acc_t<T>;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{blockDim.x} * gridDim.x) {
    const std::int64_t ch = channel_of(i, hw, c, small);
    const A g = relu_masked<A>(dy[i], y, i);
    if (gres) gres[i] = store_as<T>(g);
    if (dx) dx[i] = store_as<T>(coef[ch] * g + coef[c + ch] * load_as<A>(x[i]) + coef[2 * c + ch]);
  }
}

int bn_chunks(std::int64_t c, std::int64_t per_channel, int index) {
  const std::int64_t target = device_info(index).sms * 4;
  std::int64_t chunks = (target + c - 1) / c;
  chunks = std::min<std::int64_t>(chunks, std::max<std::int64_t>(1, per_channel / 2048));
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(chunks, 65535)));
}

// How the forward's statistics and the backward's partial sums are launched, x viewed as [n, C, hw]
// (channels-last: [n = N*H*W rows, C], hw 1): in 16-byte packs of channels (px packs a block,
// col_blocks blocks across C) when x is channels-last and C and every pointer allow it, else an element
// per thread; and over how many chunks of rows.
struct BnReduction {
  bool packed = false;
  int px = 0;
  std::int64_t col_blocks = 0;
  int chunks = 1;
};

template <class T>
BnReduction bn_reduction(bool nhwc, std::int64_t c, std::int64_t n, std::int64_t hw,
                         std::initializer_list<const void*> pointers, int index) {
  constexpr int kV = static_cast<int>(16 / sizeof(T));
  BnReduction r;
  r.packed = nhwc && pack_width<T>(c, pointers) == kV;
  if (r.packed) {
    r.px = bn_vec_packs_per_block(c / kV);
    r.col_blocks = (c / kV + r.px - 1) / r.px;
    r.chunks = bn_vec_chunks(r.col_blocks, n, index);
  } else {
    r.chunks = nhwc ? bn_nhwc_chunks(c, n, index) : bn_chunks(c, n * hw, index);
  }
  return r;
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
                        const Tensor& running_var, bool training, double momentum, double eps, const Tensor& residual,
                        bool relu, const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd) {
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
    constexpr int kV = static_cast<int>(16 / sizeof(T));
    Scratch coef(sizeof(A) * 2 * c, l.index);
    A* scale = coef.as<A>();
    A* shift = scale + c;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* rp = residual.defined() ? static_cast<const T*>(residual.data_ptr()) : nullptr;
    T* yp = static_cast<T*>(y.data_ptr());
    const BnReduction g = bn_reduction<T>(nhwc, c, n, hw, {xp, rp, yp}, l.index);
    const int chunks = training ? g.chunks : 1;  // evaluation reads no partials
    Scratch partial(training ? sizeof(Welford) * c * chunks : 0, l.index);
    if (training) {
      const std::int64_t chunk = (n * hw + chunks - 1) / chunks;
      if (g.packed)
        bn_stats_nhwc_vec_kernel<T, kV><<<dim3(static_cast<unsigned>(g.col_blocks), chunks), kBnThreads, 0, l.stream>>>(
            xp, n, c, chunk, g.px, partial.as<Welford>());
      else if (nhwc)
        bn_stats_nhwc_kernel<T><<<dim3(static_cast<unsigned>((c + 31) / 32), chunks), dim3(32, 8), 0, l.stream>>>(
            xp, n, c, chunk, partial.as<Welford>());
      else
        bn_stats_kernel<T>
            <<<dim3(static_cast<unsigned>(c), chunks), 256, 0, l.stream>>>(xp, n, c, hw, chunk, partial.as<Welford>());
      KILN_CUDA_CHECK_LAUNCH();
    }
    bn_finalize_kernel<<<static_cast<unsigned>(c), kFinalizeThreads, 0, l.stream>>>(partial.as<Welford>(), chunks, c, p,
                                                                                    scale, shift);
    KILN_CUDA_CHECK_LAUNCH();
    const std::int64_t total = x.numel();
    if (total && g.packed) {
      const std::int64_t vectors = total / kV;
      bn_apply_nhwc_vec_kernel<T, kV><<<grid_for(vectors, kBnThreads, l.index), kBnThreads, 0, l.stream>>>(
          xp, rp, relu, yp, vectors, c / kV, scale, shift);
    } else if (total) {
      bn_apply_kernel<T><<<grid_for(total, 256, l.index), 256, 0, l.stream>>>(xp, rp, relu, yp, total, c, hw, scale,
                                                                              shift, total < (std::int64_t{1} << 31));
    }
    KILN_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& y, bool relu, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_invstd, const Tensor& grad_x, const Tensor& grad_w,
                         const Tensor& grad_b, const Tensor& grad_residual) {
  const bool nhwc = is_channels_last_only(x);
  const std::int64_t c = x.shape()[1];
  const std::int64_t n = nhwc ? x.numel() / std::max<std::int64_t>(1, c) : x.shape()[0];
  const std::int64_t hw = nhwc ? 1 : x.numel() / std::max<std::int64_t>(1, n * c);
  if (c == 0) return;
  Launch l(x);
  KILN_DISPATCH_FLOATING(x.dtype(), "batch_norm_backward", [&]<class T>() {
    using A = acc_t<T>;
    constexpr int kV = static_cast<int>(16 / sizeof(T));
    const T* dyp = static_cast<const T*>(grad_y.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* yp = relu ? static_cast<const T*>(y.data_ptr()) : nullptr;
    T* dxp = grad_x.defined() ? static_cast<T*>(grad_x.data_ptr()) : nullptr;
    T* grp = grad_residual.defined() ? static_cast<T*>(grad_residual.data_ptr()) : nullptr;
    const BnReduction g = bn_reduction<T>(nhwc, c, n, hw, {dyp, xp, yp, dxp, grp}, l.index);
    const int chunks = g.chunks;
    const std::int64_t chunk = (n * hw + chunks - 1) / chunks;
    Scratch partial(sizeof(double2) * c * chunks, l.index);
    Scratch coef(sizeof(A) * 3 * c, l.index);
    if (g.packed)
      bn_bwd_reduce_nhwc_vec_kernel<T, kV>
          <<<dim3(static_cast<unsigned>(g.col_blocks), chunks), kBnThreads, 0, l.stream>>>(
              dyp, xp, yp, n, c, chunk, g.px, dyn(save_mean), partial.as<double2>());
    else if (nhwc)
      bn_bwd_reduce_nhwc_kernel<T><<<dim3(static_cast<unsigned>((c + 31) / 32), chunks), dim3(32, 8), 0, l.stream>>>(
          dyp, xp, yp, n, c, chunk, dyn(save_mean), partial.as<double2>());
    else
      bn_bwd_reduce_kernel<T><<<dim3(static_cast<unsigned>(c), chunks), 256, 0, l.stream>>>(
          dyp, xp, yp, n, c, hw, chunk, dyn(save_mean), partial.as<double2>());
    KILN_CUDA_CHECK_LAUNCH();
    BnBwdParams bp{dyn(weight), dyn(save_mean), dyn(save_invstd),
                   dyn(grad_w), dyn(grad_b),    static_cast<double>(n * hw)};
    bn_bwd_finalize_kernel<<<static_cast<unsigned>(c), kFinalizeThreads, 0, l.stream>>>(partial.as<double2>(), chunks,
                                                                                        c, bp, coef.as<A>());
    KILN_CUDA_CHECK_LAUNCH();
    const std::int64_t total = x.numel();
    if ((dxp || grp) && total) {
      if (g.packed) {
        const std::int64_t vectors = total / kV;
        bn_bwd_apply_nhwc_vec_kernel<T, kV><<<grid_for(vectors, kBnThreads, l.index), kBnThreads, 0, l.stream>>>(
            dyp, xp, yp, dxp, grp, vectors, c / kV, c, coef.as<A>());
      } else {
        bn_bwd_apply_kernel<T><<<grid_for(total, 256, l.index), 256, 0, l.stream>>>(
            dyp, xp, yp, dxp, grp, total, c, hw, coef.as<A>(), total < (std::int64_t{1} << 31));
      }
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
