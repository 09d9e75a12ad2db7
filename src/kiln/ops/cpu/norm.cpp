// CPU batch norm (per channel of NC* tensors), layer norm and RMS norm (per row of the last
// dimension). Statistics are accumulated in double; saved statistics are f32.
#include <cmath>
#include <vector>

#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/cpu_kernels.h"
#include "kiln/ops/cpu/parallel.h"

namespace kiln::ops::cpu {

namespace {

// A small per-channel parameter as doubles (empty when undefined), and back.
std::vector<double> load(const Tensor& t) {
  if (!t.defined()) return {};
  return KILN_DISPATCH_FLOATING(t.dtype(), "batch_norm", [&]<class T>() {
    const T* p = static_cast<const T*>(t.data_ptr());
    std::vector<double> v(static_cast<std::size_t>(t.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(p[i]);
    return v;
  });
}

void store(const Tensor& t, const std::vector<double>& v) {
  KILN_DISPATCH_FLOATING(t.dtype(), "batch_norm", [&]<class T>() {
    T* p = static_cast<T*>(t.data_ptr());
    for (std::size_t i = 0; i < v.size(); ++i) p[i] = from_acc<T>(static_cast<acc_t<T>>(v[i]));
  });
}

struct ChannelLayout {
  std::int64_t n, c, inner;  // x viewed as [n, c, inner]
  std::int64_t count() const { return n * inner; }
};

ChannelLayout channels(const Tensor& x) {
  ChannelLayout l{x.shape()[0], x.shape()[1], 1};
  for (std::int64_t d = 2; d < x.dim(); ++d) l.inner *= x.shape()[d];
  return l;
}

}  // namespace

void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                        const Tensor& running_var, bool training, double momentum, double eps, const Tensor& residual,
                        bool relu, const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd) {
  const ChannelLayout l = channels(x);
  const bool batch_stats = training || !running_mean.defined();
  const std::vector<double> w = load(weight), b = load(bias);
  std::vector<double> rm = load(running_mean), rv = load(running_var);
  std::vector<double> mean(static_cast<std::size_t>(l.c)), invstd(static_cast<std::size_t>(l.c));
  KILN_DISPATCH_FLOATING(x.dtype(), "batch_norm", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* rp = residual.defined() ? static_cast<const T*>(residual.data_ptr()) : nullptr;
    T* yp = static_cast<T*>(y.data_ptr());
    parallel_for(l.c, 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t c = lo; c < hi; ++c) {
        double m = 0, var = 0;
        if (batch_stats) {
          double s = 0;
          for (std::int64_t n = 0; n < l.n; ++n) {
            const T* p = xp + (n * l.c + c) * l.inner;
            for (std::int64_t i = 0; i < l.inner; ++i) s += static_cast<double>(p[i]);
          }
          m = s / static_cast<double>(l.count());
          double sq = 0;
          for (std::int64_t n = 0; n < l.n; ++n) {
            const T* p = xp + (n * l.c + c) * l.inner;
            for (std::int64_t i = 0; i < l.inner; ++i) {
              const double d = static_cast<double>(p[i]) - m;
              sq += d * d;
            }
          }
          var = sq / static_cast<double>(l.count());
        } else {
          m = rm[c];
          var = rv[c];
        }
        const double is = 1.0 / std::sqrt(var + eps);
        mean[c] = m;
        invstd[c] = is;
        if (training && running_mean.defined()) {
          const double unbiased = l.count() > 1 ? var * static_cast<double>(l.count()) / (l.count() - 1) : var;
          rm[c] = (1 - momentum) * rm[c] + momentum * m;
          rv[c] = (1 - momentum) * rv[c] + momentum * unbiased;
        }
        // y = relu?(x * scale + shift + residual?), rounded once
        const A scale = static_cast<A>(is * (w.empty() ? 1.0 : w[c]));
        const A shift = static_cast<A>((b.empty() ? 0.0 : b[c]) - m * is * (w.empty() ? 1.0 : w[c]));
        for (std::int64_t n = 0; n < l.n; ++n) {
          const std::int64_t base = (n * l.c + c) * l.inner;
          const T* p = xp + base;
          T* o = yp + base;
          for (std::int64_t i = 0; i < l.inner; ++i) {
            A v = static_cast<A>(p[i]) * scale + shift;
            if (rp) v += static_cast<A>(rp[base + i]);
            if (relu) v = v < A(0) ? A(0) : v;  // NaN stays NaN
            o[i] = from_acc<T>(v);
          }
        }
      }
    });
  });
  if (batch_stats && save_mean.defined()) {
    store(save_mean, mean);
    store(save_invstd, invstd);
  }
  if (training && running_mean.defined()) {
    store(running_mean, rm);
    store(running_var, rv);
  }
}

void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& y, bool relu, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_invstd, const Tensor& grad_x, const Tensor& grad_w,
                         const Tensor& grad_b, const Tensor& grad_residual) {
  const ChannelLayout l = channels(x);
  const std::vector<double> w = load(weight), mean = load(save_mean), invstd = load(save_invstd);
  std::vector<double> gw(static_cast<std::size_t>(l.c)), gb(static_cast<std::size_t>(l.c));
  KILN_DISPATCH_FLOATING(x.dtype(), "batch_norm_backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* dyp = static_cast<const T*>(grad_y.data_ptr());
    const T* yp = relu ? static_cast<const T*>(y.data_ptr()) : nullptr;
    T* gx = grad_x.defined() ? static_cast<T*>(grad_x.data_ptr()) : nullptr;
    T* gr = grad_residual.defined() ? static_cast<T*>(grad_residual.data_ptr()) : nullptr;
    // With the ReLU the gradient through it is dy where y > 0, else 0: masked into grad_residual
    // when it is wanted (the residual's gradient, read back below), else into a scratch copy.
    std::vector<T> masked;
    const T* gp = dyp;
    if (yp) {
      T* mp = gr;
      if (!mp) {
        masked.resize(static_cast<std::size_t>(x.numel()));
        mp = masked.data();
      }
      const std::int64_t total = x.numel();
      parallel_for(total, 1 << 14, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t i = lo; i < hi; ++i) mp[i] = static_cast<A>(yp[i]) > A(0) ? dyp[i] : from_acc<T>(A(0));
      });
      gp = mp;
    }
    parallel_for(l.c, 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t c = lo; c < hi; ++c) {
        const double m = mean[c], is = invstd[c];
        double sum_g = 0, sum_gx = 0;  // sum(gy), sum(gy * (x - mean))
        for (std::int64_t n = 0; n < l.n; ++n) {
          const T* p = xp + (n * l.c + c) * l.inner;
          const T* g = gp + (n * l.c + c) * l.inner;
          for (std::int64_t i = 0; i < l.inner; ++i) {
            const double gv = static_cast<double>(g[i]);
            sum_g += gv;
            sum_gx += gv * (static_cast<double>(p[i]) - m);
          }
        }
        gb[c] = sum_g;
        gw[c] = sum_gx * is;
        if (!gx) continue;
        // dx = w * invstd * (gy - mean(gy) - xhat * mean(gy * xhat))
        const double cnt = static_cast<double>(l.count());
        const double wc = w.empty() ? 1.0 : w[c];
        const A k = static_cast<A>(wc * is);
        const A mg = static_cast<A>(sum_g / cnt);
        const A proj = static_cast<A>(sum_gx * is * is / cnt);  // applied to (x - mean)
        const A ma = static_cast<A>(m);
        for (std::int64_t n = 0; n < l.n; ++n) {
          const T* p = xp + (n * l.c + c) * l.inner;
          const T* g = gp + (n * l.c + c) * l.inner;
          T* o = gx + (n * l.c + c) * l.inner;
          for (std::int64_t i = 0; i < l.inner; ++i)
            o[i] = from_acc<T>(k * (static_cast<A>(g[i]) - mg - (static_cast<A>(p[i]) - ma) * proj));
        }
      }
    });
  });
  if (grad_w.defined()) store(grad_w, gw);
  if (grad_b.defined()) store(grad_b, gb);
}

namespace {
// Per-column sums over rows of f(row, col), parallel over column blocks: the weight/bias gradients.
template <class F>
std::vector<double> column_sums(std::int64_t rows, std::int64_t cols, F&& f) {
  std::vector<double> out(static_cast<std::size_t>(cols), 0.0);
  parallel_for(cols, 64, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = lo; j < hi; ++j) out[j] += f(r, j);
  });
  return out;
}

// The layer/RMS-norm statistics' element type (ops/norm.cpp's statistics_dtype).
template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

std::int64_t row_grain(std::int64_t cols) { return std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(cols, 1)); }
}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd) {
  const std::int64_t rows = mean.numel(), cols = rows ? x.numel() / rows : 0;
  KILN_DISPATCH_FLOATING(x.dtype(), "layer_norm", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* wp = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
    const T* bp = b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr;
    T* yp = static_cast<T*>(y.data_ptr());
    auto* mp = static_cast<stat_t<T>*>(mean.data_ptr());
    auto* rp = static_cast<stat_t<T>*>(rstd.data_ptr());
    parallel_for(rows, row_grain(cols), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) {
        const T* in = xp + r * cols;
        T* out = yp + r * cols;
        double s = 0;
        for (std::int64_t i = 0; i < cols; ++i) s += static_cast<double>(in[i]);
        const double m = s / static_cast<double>(cols);
        double sq = 0;
        for (std::int64_t i = 0; i < cols; ++i) {
          const double d = static_cast<double>(in[i]) - m;
          sq += d * d;
        }
        const double rs = 1.0 / std::sqrt(sq / static_cast<double>(cols) + eps);
        mp[r] = static_cast<stat_t<T>>(m);
        rp[r] = static_cast<stat_t<T>>(rs);
        const A ma = static_cast<A>(m), ra = static_cast<A>(rs);
        for (std::int64_t i = 0; i < cols; ++i) {
          A v = (static_cast<A>(in[i]) - ma) * ra;
          if (wp) v *= static_cast<A>(wp[i]);
          if (bp) v += static_cast<A>(bp[i]);
          out[i] = from_acc<T>(v);
        }
      }
    });
  });
}

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                         const Tensor& grad_x, const Tensor& grad_w, const Tensor& grad_b) {
  const std::int64_t rows = mean.numel(), cols = rows ? x.numel() / rows : 0;
  KILN_DISPATCH_FLOATING(x.dtype(), "layer_norm_backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* gp = static_cast<const T*>(grad_y.data_ptr());
    const T* wp = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
    const auto* mp = static_cast<const stat_t<T>*>(mean.data_ptr());
    const auto* rp = static_cast<const stat_t<T>*>(rstd.data_ptr());
    if (grad_x.defined()) {
      T* gx = static_cast<T*>(grad_x.data_ptr());
      parallel_for(rows, row_grain(cols), [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t r = lo; r < hi; ++r) {
          const T* in = xp + r * cols;
          const T* g = gp + r * cols;
          const double m = mp[r], rs = rp[r];
          double sum_wg = 0, sum_wgx = 0;  // sum(g * w), sum(g * w * xhat)
          for (std::int64_t i = 0; i < cols; ++i) {
            const double wg = static_cast<double>(g[i]) * (wp ? static_cast<double>(wp[i]) : 1.0);
            sum_wg += wg;
            sum_wgx += wg * (static_cast<double>(in[i]) - m) * rs;
          }
          const A mwg = static_cast<A>(sum_wg / static_cast<double>(cols));
          const A mwgx = static_cast<A>(sum_wgx / static_cast<double>(cols));
          const A ma = static_cast<A>(m), ra = static_cast<A>(rs);
          T* out = gx + r * cols;
          for (std::int64_t i = 0; i < cols; ++i) {
            const A wg = static_cast<A>(g[i]) * (wp ? static_cast<A>(wp[i]) : A(1));
            const A xhat = (static_cast<A>(in[i]) - ma) * ra;
            out[i] = from_acc<T>(ra * (wg - mwg - xhat * mwgx));
          }
        }
      });
    }
    if (grad_w.defined()) {
      auto gw = column_sums(rows, cols, [&](std::int64_t r, std::int64_t j) {
        return static_cast<double>(gp[r * cols + j]) * (static_cast<double>(xp[r * cols + j]) - mp[r]) * rp[r];
      });
      T* o = static_cast<T*>(grad_w.data_ptr());
      for (std::int64_t j = 0; j < cols; ++j) o[j] = from_acc<T>(static_cast<A>(gw[j]));
    }
    if (grad_b.defined()) {
      auto gb = column_sums(rows, cols,
                            [&](std::int64_t r, std::int64_t j) { return static_cast<double>(gp[r * cols + j]); });
      T* o = static_cast<T*>(grad_b.data_ptr());
      for (std::int64_t j = 0; j < cols; ++j) o[j] = from_acc<T>(static_cast<A>(gb[j]));
    }
  });
}

void rms_norm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) {
  const std::int64_t rows = rstd.numel(), cols = rows ? x.numel() / rows : 0;
  KILN_DISPATCH_FLOATING(x.dtype(), "rms_norm", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* wp = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
    T* yp = static_cast<T*>(y.data_ptr());
    auto* rp = static_cast<stat_t<T>*>(rstd.data_ptr());
    parallel_for(rows, row_grain(cols), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) {
        const T* in = xp + r * cols;
        T* out = yp + r * cols;
        double sq = 0;
        for (std::int64_t i = 0; i < cols; ++i) sq += static_cast<double>(in[i]) * static_cast<double>(in[i]);
        const double rs = 1.0 / std::sqrt(sq / static_cast<double>(cols) + eps);
        rp[r] = static_cast<stat_t<T>>(rs);
        const A ra = static_cast<A>(rs);
        for (std::int64_t i = 0; i < cols; ++i)
          out[i] = from_acc<T>(static_cast<A>(in[i]) * ra * (wp ? static_cast<A>(wp[i]) : A(1)));
      }
    });
  });
}

void rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& grad_x,
                       const Tensor& grad_w) {
  const std::int64_t rows = rstd.numel(), cols = rows ? x.numel() / rows : 0;
  KILN_DISPATCH_FLOATING(x.dtype(), "rms_norm_backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* gp = static_cast<const T*>(grad_y.data_ptr());
    const T* wp = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
    const auto* rp = static_cast<const stat_t<T>*>(rstd.data_ptr());
    if (grad_x.defined()) {
      T* gx = static_cast<T*>(grad_x.data_ptr());
      parallel_for(rows, row_grain(cols), [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t r = lo; r < hi; ++r) {
          const T* in = xp + r * cols;
          const T* g = gp + r * cols;
          const double rs = rp[r];
          double dot = 0;  // sum(g * w * x)
          for (std::int64_t i = 0; i < cols; ++i)
            dot += static_cast<double>(g[i]) * (wp ? static_cast<double>(wp[i]) : 1.0) * static_cast<double>(in[i]);
          // dx = rstd * (g w - x rstd^2 mean(g w x))
          const A ra = static_cast<A>(rs), k = static_cast<A>(rs * rs * dot / static_cast<double>(cols));
          T* out = gx + r * cols;
          for (std::int64_t i = 0; i < cols; ++i) {
            const A wg = static_cast<A>(g[i]) * (wp ? static_cast<A>(wp[i]) : A(1));
            out[i] = from_acc<T>(ra * (wg - static_cast<A>(in[i]) * k));
          }
        }
      });
    }
    if (grad_w.defined()) {
      auto gw = column_sums(rows, cols, [&](std::int64_t r, std::int64_t j) {
        return static_cast<double>(gp[r * cols + j]) * static_cast<double>(xp[r * cols + j]) * rp[r];
      });
      T* o = static_cast<T*>(grad_w.data_ptr());
      for (std::int64_t j = 0; j < cols; ++j) o[j] = from_acc<T>(static_cast<A>(gw[j]));
    }
  });
}

}  // namespace kiln::ops::cpu
