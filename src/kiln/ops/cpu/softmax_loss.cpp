// CPU softmax / log-softmax over the last dimension and fused cross-entropy (log-softmax + NLL
// with label smoothing and ignore_index), one row per iteration, rows split across threads.
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/cpu_kernels.h"
#include "kiln/ops/cpu/parallel.h"

namespace kiln::ops::cpu {

namespace {
std::int64_t loss_row_grain(std::int64_t cols) {
  return std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(cols, 1));
}
}  // namespace

void softmax_forward(const Tensor& x, bool log, const Tensor& y) {
  const std::int64_t cols = x.dim() == 0 ? 1 : x.shape().back();
  const std::int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  KILN_DISPATCH_FLOATING(x.dtype(), log ? "log_softmax" : "softmax", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    parallel_for(rows, loss_row_grain(cols), [&](std::int64_t lo, std::int64_t hi) {
      std::vector<A> buf(static_cast<std::size_t>(cols));
      for (std::int64_t r = lo; r < hi; ++r) {
        const T* in = xp + r * cols;
        T* out = yp + r * cols;
        A mx = -std::numeric_limits<A>::infinity();
        for (std::int64_t i = 0; i < cols; ++i) {
          buf[i] = static_cast<A>(in[i]);
          mx = std::max(mx, buf[i]);
        }
        if (std::isinf(mx) && mx < 0) mx = 0;  // all -inf: avoid inf - inf
        A sum = 0;
        for (std::int64_t i = 0; i < cols; ++i) sum += std::exp(buf[i] - mx);
        if (log) {
          const A lse = mx + std::log(sum);
          for (std::int64_t i = 0; i < cols; ++i) out[i] = from_acc<T>(buf[i] - lse);
        } else {
          const A inv = A(1) / sum;
          for (std::int64_t i = 0; i < cols; ++i) out[i] = from_acc<T>(std::exp(buf[i] - mx) * inv);
        }
      }
    });
  });
}

void softmax_backward(const Tensor& grad_y, const Tensor& y, bool log, const Tensor& grad_x) {
  const std::int64_t cols = y.dim() == 0 ? 1 : y.shape().back();
  const std::int64_t rows = cols == 0 ? 0 : y.numel() / cols;
  KILN_DISPATCH_FLOATING(y.dtype(), log ? "log_softmax_backward" : "softmax_backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* gp = static_cast<const T*>(grad_y.data_ptr());
    const T* yp = static_cast<const T*>(y.data_ptr());
    T* gx = static_cast<T*>(grad_x.data_ptr());
    parallel_for(rows, loss_row_grain(cols), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) {
        const T* g = gp + r * cols;
        const T* o = yp + r * cols;
        T* out = gx + r * cols;
        A dot = 0;
        if (log) {  // dx = g - softmax * sum(g)
          for (std::int64_t i = 0; i < cols; ++i) dot += static_cast<A>(g[i]);
          for (std::int64_t i = 0; i < cols; ++i)
            out[i] = from_acc<T>(static_cast<A>(g[i]) - std::exp(static_cast<A>(o[i])) * dot);
        } else {  // dx = y * (g - sum(g * y))
          for (std::int64_t i = 0; i < cols; ++i) dot += static_cast<A>(g[i]) * static_cast<A>(o[i]);
          for (std::int64_t i = 0; i < cols; ++i)
            out[i] = from_acc<T>(static_cast<A>(o[i]) * (static_cast<A>(g[i]) - dot));
        }
      }
    });
  });
}

void cross_entropy_forward(const Tensor& logits, const Tensor& target, std::int64_t ignore_index,
                           double label_smoothing, const Tensor& loss, const Tensor& lse) {
  const std::int64_t rows = logits.shape()[0], cols = logits.shape()[1];
  KILN_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(logits.data_ptr());
    const auto* tp = static_cast<const std::int64_t*>(target.data_ptr());
    T* lp = static_cast<T*>(loss.data_ptr());
    auto* sp = static_cast<float*>(lse.data_ptr());
    const A eps = static_cast<A>(label_smoothing);
    parallel_for(rows, loss_row_grain(cols), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) {
        const T* in = xp + r * cols;
        A mx = -std::numeric_limits<A>::infinity();
        A total = 0;
        for (std::int64_t i = 0; i < cols; ++i) {
          const A v = static_cast<A>(in[i]);
          mx = std::max(mx, v);
          total += v;
        }
        A sum = 0;
        for (std::int64_t i = 0; i < cols; ++i) sum += std::exp(static_cast<A>(in[i]) - mx);
        const A l = mx + std::log(sum);
        sp[r] = static_cast<float>(l);
        const std::int64_t t = tp[r];
        if (t == ignore_index) {
          lp[r] = from_acc<T>(A(0));
          continue;
        }
        KILN_CHECK(t >= 0 && t < cols, "cross_entropy: target {} in row {} is out of range for {} classes", t, r, cols);
        // (1 - eps) * (lse - x_t) + eps / C * sum_c (lse - x_c)
        const A nll = l - static_cast<A>(in[t]);
        const A smooth = l - total / static_cast<A>(cols);
        lp[r] = from_acc<T>((A(1) - eps) * nll + eps * smooth);
      }
    });
  });
}

void cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                            std::int64_t ignore_index, double label_smoothing, const Tensor& grad_logits) {
  const std::int64_t rows = logits.shape()[0], cols = logits.shape()[1];
  KILN_DISPATCH_FLOATING(logits.dtype(), "cross_entropy_backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(logits.data_ptr());
    const T* gp = static_cast<const T*>(grad_loss.data_ptr());
    const auto* tp = static_cast<const std::int64_t*>(target.data_ptr());
    const auto* sp = static_cast<const float*>(lse.data_ptr());
    T* gx = static_cast<T*>(grad_logits.data_ptr());
    const A eps = static_cast<A>(label_smoothing);
    parallel_for(rows, loss_row_grain(cols), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) {
        T* out = gx + r * cols;
        const std::int64_t t = tp[r];
        if (t == ignore_index) {
          for (std::int64_t i = 0; i < cols; ++i) out[i] = from_acc<T>(A(0));
          continue;
        }
        const T* in = xp + r * cols;
        const A g = static_cast<A>(gp[r]), l = static_cast<A>(sp[r]), uniform = eps / static_cast<A>(cols);
        for (std::int64_t i = 0; i < cols; ++i) {
          const A target_p = (i == t ? A(1) - eps : A(0)) + uniform;
          out[i] = from_acc<T>((std::exp(static_cast<A>(in[i]) - l) - target_p) * g);
        }
      }
    });
  });
}

}  // namespace kiln::ops::cpu
