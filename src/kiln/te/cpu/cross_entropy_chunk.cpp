// CPU kernel of linear_cross_entropy's chunk step: per row of logits, logsumexp, the weighted
// loss, and (optionally) the weighted gradient (softmax - onehot) written over the logits.
#include <cmath>

#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/parallel.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te::cpu {

using ops::cpu::acc_t;
using ops::cpu::from_acc;

void cross_entropy_chunk(const Tensor& logits, const Tensor& labels, const Tensor& row_weight, const Tensor& loss,
                         bool write_grad) {
  const std::int64_t rows = logits.shape()[0], vocab = logits.shape()[1];
  const auto* lp = static_cast<const std::int64_t*>(labels.data_ptr());
  KILN_DISPATCH_FLOATING(logits.dtype(), "linear_cross_entropy", [&]<class T>() {
    using A = acc_t<T>;
    T* zp = static_cast<T*>(logits.data_ptr());
    const A* wp = static_cast<const A*>(row_weight.data_ptr());
    A* out = static_cast<A*>(loss.data_ptr());
    ops::cpu::parallel_for(rows, 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) {
        T* z = zp + r * vocab;
        const A weight = wp[r];
        if (weight == A(0)) {
          out[r] = A(0);
          if (write_grad)
            for (std::int64_t j = 0; j < vocab; ++j) z[j] = from_acc<T>(A(0));
          continue;
        }
        A mx = static_cast<A>(z[0]);
        for (std::int64_t j = 1; j < vocab; ++j) mx = std::max(mx, static_cast<A>(z[j]));
        A s = 0;
        for (std::int64_t j = 0; j < vocab; ++j) s += std::exp(static_cast<A>(z[j]) - mx);
        const A lse = mx + std::log(s);
        const std::int64_t label = lp[r];
        out[r] = (lse - static_cast<A>(z[label])) * weight;
        if (!write_grad) continue;
        for (std::int64_t j = 0; j < vocab; ++j)
          z[j] = from_acc<T>((std::exp(static_cast<A>(z[j]) - lse) - (j == label ? A(1) : A(0))) * weight);
      }
    });
  });
}

}  // namespace kiln::te::cpu
