// CPU kernels of add_rms_norm and add_layer_norm: one pass per row forms sum = x + residual,
// stores it in the data dtype, and normalises the stored (rounded) sum, so that the backward,
// which reads the saved sum, differentiates exactly what the forward computed. Statistics are
// accumulated in double; the weight/bias gradients are double column sums.
#include <cmath>
#include <optional>
#include <vector>

#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/parallel.h"
#include "kiln/te/cpu/fp8_sink.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te::cpu {

using ops::cpu::acc_t;
using ops::cpu::from_acc;
using ops::cpu::parallel_for;

namespace {

// A norm parameter (the data dtype or float32) as doubles; empty when undefined.
std::vector<double> load_param(const Tensor& t) {
  if (!t.defined()) return {};
  return KILN_DISPATCH_FLOATING(t.dtype(), "add_norm", [&]<class P>() {
    const P* p = static_cast<const P*>(t.data_ptr());
    std::vector<double> v(static_cast<std::size_t>(t.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(p[i]);
    return v;
  });
}

void store_param(const Tensor& t, const std::vector<double>& v) {
  KILN_DISPATCH_FLOATING(t.dtype(), "add_norm", [&]<class P>() {
    P* p = static_cast<P*>(t.data_ptr());
    for (std::size_t i = 0; i < v.size(); ++i) p[i] = from_acc<P>(static_cast<acc_t<P>>(v[i]));
  });
}

template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

std::int64_t row_grain(std::int64_t cols) { return std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(cols, 1)); }

// Per-column sums over rows of f(row, col), parallel over column blocks.
template <class F>
std::vector<double> column_sums(std::int64_t rows, std::int64_t cols, F&& f) {
  std::vector<double> out(static_cast<std::size_t>(cols), 0.0);
  parallel_for(cols, 64, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = lo; j < hi; ++j) out[static_cast<std::size_t>(j)] += f(r, j);
  });
  return out;
}

// The shared forward: sum = x + residual per row, then the statistics and the affine output. With
// y8 the output values (rounded to the data dtype, as y would hold them) go to its FP8 cast.
template <bool kRms>
void forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
             const Tensor& sum, const Tensor& mean, const Tensor& rstd, const Fp8Tensor* y8 = nullptr) {
  const std::int64_t rows = rstd.numel(), cols = rows ? x.numel() / rows : 0;
  const std::vector<double> wv = load_param(w), bv = load_param(b);
  std::vector<float> row_amax(y8 ? static_cast<std::size_t>(rows) : 0, 0.0f);
  const std::optional<Fp8Sink> sink = y8 ? std::optional<Fp8Sink>(Fp8Sink(*y8)) : std::nullopt;
  KILN_DISPATCH_FLOATING(x.dtype(), kRms ? "add_rms_norm" : "add_layer_norm", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* rp = residual.defined() ? static_cast<const T*>(residual.data_ptr()) : nullptr;
    T* yp = y.defined() ? static_cast<T*>(y.data_ptr()) : nullptr;
    T* sp = static_cast<T*>(sum.data_ptr());
    auto* mp = kRms ? nullptr : static_cast<stat_t<T>*>(mean.data_ptr());
    auto* rsp = static_cast<stat_t<T>*>(rstd.data_ptr());
    parallel_for(rows, row_grain(cols), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) {
        T* s = sp + r * cols;
        double total = 0;
        for (std::int64_t i = 0; i < cols; ++i) {
          const A v = static_cast<A>(xp[r * cols + i]) + (rp ? static_cast<A>(rp[r * cols + i]) : A(0));
          s[i] = from_acc<T>(v);
          total += static_cast<double>(s[i]);
        }
        const double m = kRms ? 0.0 : total / static_cast<double>(cols);
        double sq = 0;
        for (std::int64_t i = 0; i < cols; ++i) {
          const double d = static_cast<double>(s[i]) - m;
          sq += d * d;
        }
        const double rs = 1.0 / std::sqrt(sq / static_cast<double>(cols) + eps);
        if (mp) mp[r] = static_cast<stat_t<T>>(m);
        rsp[r] = static_cast<stat_t<T>>(rs);
        const A ma = static_cast<A>(m), ra = static_cast<A>(rs);
        T* out = yp ? yp + r * cols : nullptr;
        float amax = 0.0f;
        for (std::int64_t i = 0; i < cols; ++i) {
          A v = (static_cast<A>(s[i]) - ma) * ra;
          if (!wv.empty()) v *= static_cast<A>(wv[static_cast<std::size_t>(i)]);
          if (!bv.empty()) v += static_cast<A>(bv[static_cast<std::size_t>(i)]);
          const T o = from_acc<T>(v);
          if (out) out[i] = o;
          if (sink) amax = std::fmax(amax, sink->put(r * cols + i, static_cast<float>(o)));
        }
        if (sink) row_amax[static_cast<std::size_t>(r)] = amax;
      }
    });
  });
  if (sink) {
    float amax = 0.0f;
    for (float a : row_amax) amax = std::fmax(amax, a);
    sink->finish(*y8, amax);
  }
}

// The shared backward. With xhat = (sum - mean) * rstd and g = dy * w:
//   layer norm: dsum = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMS norm:   dsum = rstd * (g - xhat * mean(g * xhat))
// plus the gradient that reaches the sum directly (the next residual).
template <bool kRms>
void backward(const Tensor& dy, const Tensor& dsum, const Tensor& sum, const Tensor& w, const Tensor& mean,
              const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db) {
  const std::int64_t rows = rstd.numel(), cols = rows ? sum.numel() / rows : 0;
  const std::vector<double> wv = load_param(w);
  KILN_DISPATCH_FLOATING(sum.dtype(), kRms ? "add_rms_norm_backward" : "add_layer_norm_backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* sp = static_cast<const T*>(sum.data_ptr());
    const T* gp = static_cast<const T*>(dy.data_ptr());
    const T* dsp = dsum.defined() ? static_cast<const T*>(dsum.data_ptr()) : nullptr;
    const auto* mp = kRms ? nullptr : static_cast<const stat_t<T>*>(mean.data_ptr());
    const auto* rsp = static_cast<const stat_t<T>*>(rstd.data_ptr());
    auto xhat = [&](std::int64_t r, std::int64_t i) {
      return (static_cast<double>(sp[r * cols + i]) - (mp ? static_cast<double>(mp[r]) : 0.0)) *
             static_cast<double>(rsp[r]);
    };
    if (dx.defined()) {
      T* out = static_cast<T*>(dx.data_ptr());
      parallel_for(rows, row_grain(cols), [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t r = lo; r < hi; ++r) {
          double sum_g = 0, sum_gx = 0;
          for (std::int64_t i = 0; i < cols; ++i) {
            const double g =
                static_cast<double>(gp[r * cols + i]) * (wv.empty() ? 1.0 : wv[static_cast<std::size_t>(i)]);
            sum_g += g;
            sum_gx += g * xhat(r, i);
          }
          const A mg = kRms ? A(0) : static_cast<A>(sum_g / static_cast<double>(cols));
          const A mgx = static_cast<A>(sum_gx / static_cast<double>(cols));
          const A ra = static_cast<A>(rsp[r]);
          for (std::int64_t i = 0; i < cols; ++i) {
            const A g = static_cast<A>(gp[r * cols + i]) *
                        (wv.empty() ? A(1) : static_cast<A>(wv[static_cast<std::size_t>(i)]));
            A v = ra * (g - mg - static_cast<A>(xhat(r, i)) * mgx);
            if (dsp) v += static_cast<A>(dsp[r * cols + i]);
            out[r * cols + i] = from_acc<T>(v);
          }
        }
      });
    }
    if (dw.defined())
      store_param(dw, column_sums(rows, cols, [&](std::int64_t r, std::int64_t j) {
                    return static_cast<double>(gp[r * cols + j]) * xhat(r, j);
                  }));
    if (db.defined())
      store_param(db, column_sums(rows, cols, [&](std::int64_t r, std::int64_t j) {
                    return static_cast<double>(gp[r * cols + j]);
                  }));
  });
}

}  // namespace

void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, double eps, const Tensor& y,
                          const Tensor& sum, const Tensor& rstd) {
  forward<true>(x, residual, w, Tensor(), eps, y, sum, Tensor(), rstd);
}

void add_rms_norm_backward(const Tensor& dy, const Tensor& dsum, const Tensor& sum, const Tensor& w, const Tensor& rstd,
                           const Tensor& dx, const Tensor& dw) {
  backward<true>(dy, dsum, sum, w, Tensor(), rstd, dx, dw, Tensor());
}

void add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps,
                            const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd) {
  forward<false>(x, residual, w, b, eps, y, sum, mean, rstd);
}

void add_rms_norm_fp8_forward(const Tensor& x, const Tensor& residual, const Tensor& w, double eps, const Fp8Tensor& y8,
                              const Tensor& sum, const Tensor& rstd) {
  forward<true>(x, residual, w, Tensor(), eps, Tensor(), sum, Tensor(), rstd, &y8);
}

void add_layer_norm_fp8_forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps,
                                const Fp8Tensor& y8, const Tensor& sum, const Tensor& mean, const Tensor& rstd) {
  forward<false>(x, residual, w, b, eps, Tensor(), sum, mean, rstd, &y8);
}

void add_layer_norm_backward(const Tensor& dy, const Tensor& dsum, const Tensor& sum, const Tensor& w,
                             const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dw,
                             const Tensor& db) {
  backward<false>(dy, dsum, sum, w, mean, rstd, dx, dw, db);
}

}  // namespace kiln::te::cpu
