// CPU 2-D convolution (NCHW) by im2col + OpenBLAS GEMM. A chunk of samples is unfolded into one
// column matrix [C*KH*KW, B*OH*OW] so each group needs a single large GEMM (threaded by OpenBLAS);
// unfolding, folding and the output transposes run on kernel threads, one (sample, channel) per
// task. bf16/f16 are computed in f32, f64 in f64.
#include <cblas.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/cpu_kernels.h"
#include "kiln/ops/cpu/parallel.h"

namespace kiln::ops::cpu {

namespace {

// Column matrices are capped at about this many elements; larger batches are processed in chunks.
constexpr std::int64_t kColumnBudget = std::int64_t{1} << 23;

struct ConvGeometry {
  std::int64_t n, c, h, w;       // input
  std::int64_t oc, kh, kw;       // weight [oc, c / groups, kh, kw]
  std::int64_t oh, ow;           // output
  std::int64_t groups, cg, ocg;  // channels per group
  std::int64_t plane() const { return oh * ow; }
  std::int64_t ck() const { return cg * kh * kw; }  // rows of one group's column matrix
};

ConvGeometry geometry(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  ConvGeometry g{};
  g.n = x.shape()[0];
  g.c = x.shape()[1];
  g.h = x.shape()[2];
  g.w = x.shape()[3];
  g.oc = w.shape()[0];
  g.kh = w.shape()[2];
  g.kw = w.shape()[3];
  g.oh = y.shape()[2];
  g.ow = y.shape()[3];
  g.groups = p.groups;
  g.cg = g.c / p.groups;
  g.ocg = g.oc / p.groups;
  return g;
}

// Row-major GEMM in the compute type: C = alpha op(A) op(B) + beta C.
template <class C>
void gemm_rm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const C* a, std::int64_t lda, const C* b,
             std::int64_t ldb, C beta, C* c, std::int64_t ldc) {
  const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<C, double>)
    cblas_dgemm(CblasRowMajor, opa, opb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  else
    cblas_sgemm(CblasRowMajor, opa, opb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// The output columns [lo, hi) whose input column ow * stride + offset lies in [0, size).
inline void valid_range(std::int64_t out, std::int64_t size, std::int64_t stride, std::int64_t offset, std::int64_t& lo,
                        std::int64_t& hi) {
  lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  hi = size - 1 - offset < 0 ? 0 : (size - 1 - offset) / stride + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
}

// Unfolds channel `c` of one sample (plane `src`, H x W) into rows (c*KH + kh)*KW + kw of `cols`,
// at column offset `col0` (row length `ld`).
template <class T, class C>
void im2col_channel(const T* src, const ConvGeometry& g, const Conv2dParams& p, std::int64_t c, C* cols,
                    std::int64_t ld, std::int64_t col0) {
  for (std::int64_t i = 0; i < g.kh; ++i) {
    for (std::int64_t j = 0; j < g.kw; ++j) {
      C* dst = cols + ((c * g.kh + i) * g.kw + j) * ld + col0;
      const std::int64_t woff = j * p.dilation_w - p.pad_w;
      std::int64_t lo, hi;
      valid_range(g.ow, g.w, p.stride_w, woff, lo, hi);
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        C* row = dst + oy * g.ow;
        const std::int64_t iy = oy * p.stride_h - p.pad_h + i * p.dilation_h;
        if (iy < 0 || iy >= g.h) {
          std::fill(row, row + g.ow, C(0));
          continue;
        }
        const T* in = src + iy * g.w;
        std::fill(row, row + lo, C(0));
        if (p.stride_w == 1) {
          for (std::int64_t ox = lo; ox < hi; ++ox) row[ox] = static_cast<C>(in[ox + woff]);
        } else {
          for (std::int64_t ox = lo; ox < hi; ++ox) row[ox] = static_cast<C>(in[ox * p.stride_w + woff]);
        }
        std::fill(row + hi, row + g.ow, C(0));
      }
    }
  }
}

// The adjoint of im2col_channel: accumulates the rows of channel c back into plane `dst`.
template <class C>
void col2im_channel(const C* cols, std::int64_t ld, std::int64_t col0, const ConvGeometry& g, const Conv2dParams& p,
                    std::int64_t c, C* dst) {
  for (std::int64_t i = 0; i < g.kh; ++i) {
    for (std::int64_t j = 0; j < g.kw; ++j) {
      const C* src = cols + ((c * g.kh + i) * g.kw + j) * ld + col0;
      const std::int64_t woff = j * p.dilation_w - p.pad_w;
      std::int64_t lo, hi;
      valid_range(g.ow, g.w, p.stride_w, woff, lo, hi);
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        const std::int64_t iy = oy * p.stride_h - p.pad_h + i * p.dilation_h;
        if (iy < 0 || iy >= g.h) continue;
        const C* row = src + oy * g.ow;
        C* out = dst + iy * g.w;
        for (std::int64_t ox = lo; ox < hi; ++ox) out[ox * p.stride_w + woff] += row[ox];
      }
    }
  }
}

// The weight in the compute type (a pointer to it directly when the types agree).
template <class T, class C>
const C* weight_as(const Tensor& w, std::vector<C>& storage) {
  const T* p = static_cast<const T*>(w.data_ptr());
  if constexpr (std::is_same_v<T, C>) {
    return p;
  } else {
    storage.resize(static_cast<std::size_t>(w.numel()));
    for (std::size_t i = 0; i < storage.size(); ++i) storage[i] = static_cast<C>(p[i]);
    return storage.data();
  }
}

std::int64_t chunk_size(const ConvGeometry& g) {
  const std::int64_t per_sample = std::max<std::int64_t>(1, g.c * g.kh * g.kw * g.plane());
  return std::clamp<std::int64_t>(kColumnBudget / per_sample, 1, std::max<std::int64_t>(g.n, 1));
}

template <class T>
void forward_impl(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& p) {
  using C = acc_t<T>;
  const ConvGeometry g = geometry(x, w, y, p);
  const std::int64_t P = g.plane(), CK = g.ck(), B = chunk_size(g);
  const T* xp = static_cast<const T*>(x.data_ptr());
  T* yp = static_cast<T*>(y.data_ptr());
  std::vector<C> wstore;
  const C* wp = weight_as<T, C>(w, wstore);
  std::vector<C> bvals(static_cast<std::size_t>(g.oc), C(0));
  if (bias.defined()) {
    const T* bp = static_cast<const T*>(bias.data_ptr());
    for (std::int64_t o = 0; o < g.oc; ++o) bvals[o] = static_cast<C>(bp[o]);
  }
  std::vector<C> cols(static_cast<std::size_t>(g.c * g.kh * g.kw * B * P));
  std::vector<C> out(static_cast<std::size_t>(g.oc * B * P));
  for (std::int64_t n0 = 0; n0 < g.n; n0 += B) {
    const std::int64_t nb = std::min(B, g.n - n0), ld = nb * P;
    parallel_for(nb * g.c, 4, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t t = lo; t < hi; ++t) {
        const std::int64_t b = t / g.c, c = t % g.c;
        im2col_channel(xp + ((n0 + b) * g.c + c) * g.h * g.w, g, p, c, cols.data(), ld, b * P);
      }
    });
    for (std::int64_t gi = 0; gi < g.groups; ++gi)
      gemm_rm<C>(false, false, g.ocg, ld, CK, wp + gi * g.ocg * CK, CK, cols.data() + gi * CK * ld, ld, C(0),
                 out.data() + gi * g.ocg * ld, ld);
    parallel_for(nb * g.oc, 4, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t t = lo; t < hi; ++t) {
        const std::int64_t b = t / g.oc, o = t % g.oc;
        const C* src = out.data() + o * ld + b * P;
        T* dst = yp + ((n0 + b) * g.oc + o) * P;
        const C bv = bvals[o];
        for (std::int64_t i = 0; i < P; ++i) dst[i] = from_acc<T>(src[i] + bv);
      }
    });
  }
}

template <class T>
void backward_impl(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& grad_x, const Tensor& grad_w,
                   const Tensor& grad_b, const Conv2dParams& p) {
  using C = acc_t<T>;
  const ConvGeometry g = geometry(x, w, grad_y, p);
  const std::int64_t P = g.plane(), CK = g.ck(), B = chunk_size(g);
  const T* xp = static_cast<const T*>(x.data_ptr());
  const T* gyp = static_cast<const T*>(grad_y.data_ptr());

  if (grad_b.defined()) {
    T* gb = static_cast<T*>(grad_b.data_ptr());
    parallel_for(g.oc, 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t o = lo; o < hi; ++o) {
        double s = 0;
        for (std::int64_t n = 0; n < g.n; ++n) {
          const T* row = gyp + (n * g.oc + o) * P;
          for (std::int64_t i = 0; i < P; ++i) s += static_cast<double>(row[i]);
        }
        gb[o] = from_acc<T>(static_cast<C>(s));
      }
    });
  }
  if (!grad_x.defined() && !grad_w.defined()) return;

  std::vector<C> wstore;
  const C* wp = weight_as<T, C>(w, wstore);
  std::vector<C> gw(grad_w.defined() ? static_cast<std::size_t>(w.numel()) : 0);
  std::vector<C> cols(static_cast<std::size_t>(g.c * g.kh * g.kw * B * P));
  std::vector<C> gyb(static_cast<std::size_t>(g.oc * B * P));
  T* gxp = grad_x.defined() ? static_cast<T*>(grad_x.data_ptr()) : nullptr;
  for (std::int64_t n0 = 0; n0 < g.n; n0 += B) {
    const std::int64_t nb = std::min(B, g.n - n0), ld = nb * P;
    // grad_y of the chunk as [OC, nb * P], the layout of the forward's GEMM output.
    parallel_for(nb * g.oc, 4, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t t = lo; t < hi; ++t) {
        const std::int64_t b = t / g.oc, o = t % g.oc;
        const T* src = gyp + ((n0 + b) * g.oc + o) * P;
        C* dst = gyb.data() + o * ld + b * P;
        for (std::int64_t i = 0; i < P; ++i) dst[i] = static_cast<C>(src[i]);
      }
    });
    if (grad_w.defined()) {
      parallel_for(nb * g.c, 4, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t t = lo; t < hi; ++t) {
          const std::int64_t b = t / g.c, c = t % g.c;
          im2col_channel(xp + ((n0 + b) * g.c + c) * g.h * g.w, g, p, c, cols.data(), ld, b * P);
        }
      });
      // grad_w[g] (+)= grad_y[g] [OCg, ld] x cols[g]^T [ld, CK]
      for (std::int64_t gi = 0; gi < g.groups; ++gi)
        gemm_rm<C>(false, true, g.ocg, CK, ld, gyb.data() + gi * g.ocg * ld, ld, cols.data() + gi * CK * ld, ld,
                   n0 == 0 ? C(0) : C(1), gw.data() + gi * g.ocg * CK, CK);
    }
    if (gxp) {
      // grad_cols[g] = w[g]^T [CK, OCg] x grad_y[g] [OCg, ld], then folded back per (sample, channel).
      for (std::int64_t gi = 0; gi < g.groups; ++gi)
        gemm_rm<C>(true, false, CK, ld, g.ocg, wp + gi * g.ocg * CK, CK, gyb.data() + gi * g.ocg * ld, ld, C(0),
                   cols.data() + gi * CK * ld, ld);
      parallel_for(nb * g.c, 4, [&](std::int64_t lo, std::int64_t hi) {
        std::vector<C> plane(static_cast<std::size_t>(g.h * g.w));
        for (std::int64_t t = lo; t < hi; ++t) {
          const std::int64_t b = t / g.c, c = t % g.c;
          std::fill(plane.begin(), plane.end(), C(0));
          col2im_channel(cols.data(), ld, b * P, g, p, c, plane.data());
          T* dst = gxp + ((n0 + b) * g.c + c) * g.h * g.w;
          for (std::size_t i = 0; i < plane.size(); ++i) dst[i] = from_acc<T>(plane[i]);
        }
      });
    }
  }
  if (grad_w.defined()) {
    T* gwp = static_cast<T*>(grad_w.data_ptr());
    for (std::size_t i = 0; i < gw.size(); ++i) gwp[i] = from_acc<T>(gw[i]);
  }
}

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& p) {
  KILN_DISPATCH_FLOATING(x.dtype(), "conv2d", [&]<class T>() { forward_impl<T>(x, w, bias, y, p); });
}

void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& grad_x, const Tensor& grad_w,
                     const Tensor& grad_b, const Conv2dParams& p) {
  KILN_DISPATCH_FLOATING(x.dtype(), "conv2d_backward",
                         [&]<class T>() { backward_impl<T>(grad_y, x, w, grad_x, grad_w, grad_b, p); });
}

}  // namespace kiln::ops::cpu
