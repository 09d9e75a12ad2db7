// CPU kernels of linear_bias_gelu: the GEMMs through the registry's CPU gemm (ops::gemm_into),
// the bias and GELU as one pass over the product; the backward's dgelu and bias gradient as one
// pass before the two GEMMs.
#include <vector>

#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/parallel.h"
#include "kiln/ops/linalg.h"
#include "kiln/te/fused_ops.h"
#include "kiln/te/gelu_tanh.h"

namespace kiln::te::cpu {

using ops::cpu::acc_t;
using ops::cpu::from_acc;

namespace {
Tensor as_batch(const Tensor& m) { return m.view({1, m.shape()[0], m.shape()[1]}); }

// dpre = dy * gelu_tanh'(pre) and, when db is defined, db = its column sums (in double).
void dgelu_pass(const Tensor& dy, const Tensor& pre, const Tensor& dpre, const Tensor& db) {
  const std::int64_t n = dy.shape()[0], o = dy.shape()[1];
  KILN_DISPATCH_FLOATING(dy.dtype(), "linear_bias_gelu_backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* gp = static_cast<const T*>(dy.data_ptr());
    const T* pp = static_cast<const T*>(pre.data_ptr());
    T* dp = static_cast<T*>(dpre.data_ptr());
    ops::cpu::parallel_for(n * o, 4096, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i)
        dp[i] = from_acc<T>(static_cast<A>(gp[i]) * gelu_tanh_grad(static_cast<A>(pp[i])));
    });
    if (!db.defined()) return;
    std::vector<double> sums(static_cast<std::size_t>(o), 0.0);
    ops::cpu::parallel_for(o, 64, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t j = lo; j < hi; ++j) sums[static_cast<std::size_t>(j)] += static_cast<double>(dp[r * o + j]);
    });
    T* bp = static_cast<T*>(db.data_ptr());
    for (std::int64_t j = 0; j < o; ++j) bp[j] = from_acc<T>(static_cast<A>(sums[static_cast<std::size_t>(j)]));
  });
}
}  // namespace

void linear_bias_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& pre) {
  const std::int64_t n = x.shape()[0], o = w.shape()[0];
  ops::gemm_into(as_batch(x), as_batch(w), as_batch(pre), false, true, 1.0, 0.0);
  KILN_DISPATCH_FLOATING(x.dtype(), "linear_bias_gelu", [&]<class T>() {
    using A = acc_t<T>;
    T* pp = static_cast<T*>(pre.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    const T* bp = b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr;
    ops::cpu::parallel_for(n, 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r)
        for (std::int64_t j = 0; j < o; ++j) {
          // The pre-activation is stored rounded, as the CUDA epilogue's aux output is.
          const T v = from_acc<T>(static_cast<A>(pp[r * o + j]) + (bp ? static_cast<A>(bp[j]) : A(0)));
          pp[r * o + j] = v;
          yp[r * o + j] = from_acc<T>(gelu_tanh(static_cast<A>(v)));
        }
    });
  });
}

void linear_bias_gelu_backward(const Tensor& dy, const Tensor& pre, const Tensor& x, const Tensor& w, const Tensor& dx,
                               const Tensor& dw, const Tensor& db) {
  Tensor dpre = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  dgelu_pass(dy, pre, dpre, db);
  if (dx.defined()) ops::gemm_into(as_batch(dpre), as_batch(w), as_batch(dx), false, false, 1.0, 0.0);
  if (dw.defined()) ops::gemm_into(as_batch(dpre), as_batch(x), as_batch(dw), true, false, 1.0, 0.0);
}

void dgelu_bgrad_gemm(const Tensor& dout, const Tensor& w2, const Tensor& pre, const Tensor& dpre, const Tensor& db) {
  Tensor dh = Tensor::empty(dpre.shape(), dpre.dtype(), dpre.device());
  ops::gemm_into(as_batch(dout), as_batch(w2), as_batch(dh), false, false, 1.0, 0.0);
  dgelu_pass(dh, pre, dpre, db);
}

}  // namespace kiln::te::cpu
