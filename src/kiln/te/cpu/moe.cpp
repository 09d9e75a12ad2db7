// CPU kernels of the mixture-of-experts family (te/moe_ops.h): the router per token in double,
// the dispatch plan per expert, gathers per row, and the grouped GEMM as one BLAS GEMM per expert
// (the CPU path may loop over experts; the CUDA one is a single grouped kernel).
#include <algorithm>
#include <numeric>
#include <vector>

#include "kiln/ops/copy.h"
#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/parallel.h"
#include "kiln/ops/linalg.h"
#include "kiln/te/moe_ops.h"
#include "kiln/te/moe_router_math.h"

namespace kiln::te::cpu {

using ops::cpu::acc_t;
using ops::cpu::from_acc;

namespace {

// The router kernels' storage types: f32, and f64 (the reference path).
template <class F>
void dispatch_router(DType dtype, const char* op, F&& f) {
  if (dtype == DType::F32)
    f.template operator()<float>();
  else if (dtype == DType::F64)
    f.template operator()<double>();
  else
    KILN_FAIL("{}: logits must be float32 or float64, got {}", op, dtype_name(dtype));
}

}  // namespace

void router_topk_forward(const Tensor& logits, const Tensor& expert_bias, const RouterTopkParams& p,
                         const Tensor& probs, const Tensor& indices) {
  const std::int64_t n = logits.shape()[0], e = logits.shape()[1];
  dispatch_router(logits.dtype(), "router_topk", [&]<class L>() {
    const L* lp = static_cast<const L*>(logits.data_ptr());
    const L* bp = expert_bias.defined() ? static_cast<const L*>(expert_bias.data_ptr()) : nullptr;
    L* pp = static_cast<L*>(probs.data_ptr());
    auto* ip = static_cast<std::int64_t*>(indices.data_ptr());
    ops::cpu::parallel_for(n, 64, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r)
        moe_math::router_topk_row<double, L>(lp + r * e, bp, e, p, pp + r * p.topk, ip + r * p.topk);
    });
  });
}

void router_topk_backward(const Tensor& dprobs, const Tensor& logits, const Tensor& indices, const Tensor& probs,
                          const RouterTopkParams& p, const Tensor& dlogits) {
  const std::int64_t n = logits.shape()[0], e = logits.shape()[1];
  dispatch_router(logits.dtype(), "router_topk_backward", [&]<class L>() {
    const L* gp = static_cast<const L*>(dprobs.data_ptr());
    const L* lp = static_cast<const L*>(logits.data_ptr());
    const auto* ip = static_cast<const std::int64_t*>(indices.data_ptr());
    const L* pp = static_cast<const L*>(probs.data_ptr());
    L* dp = static_cast<L*>(dlogits.data_ptr());
    ops::cpu::parallel_for(n, 64, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r)
        moe_math::router_topk_backward_row<double, L>(gp + r * p.topk, lp + r * e, ip + r * p.topk, pp + r * p.topk, e,
                                                      p, dp + r * e);
    });
  });
}

void moe_dispatch_plan(const Tensor& indices, const Tensor& probs, std::int64_t capacity, bool pad,
                       bool drop_by_position, const Tensor& src_token, const Tensor& row_of, const Tensor& offsets,
                       const Tensor& tokens, const Tensor& dropped) {
  const std::int64_t n = indices.shape()[0], k = indices.shape()[1], e_count = tokens.numel();
  const std::int64_t rows = src_token.numel();
  const auto* ip = static_cast<const std::int64_t*>(indices.data_ptr());
  const float* pp = static_cast<const float*>(probs.data_ptr());
  auto* src = static_cast<std::int64_t*>(src_token.data_ptr());
  auto* row = static_cast<std::int64_t*>(row_of.data_ptr());
  auto* off = static_cast<std::int64_t*>(offsets.data_ptr());
  auto* tok = static_cast<std::int64_t*>(tokens.data_ptr());
  auto* drop = static_cast<std::int64_t*>(dropped.data_ptr());
  // Each expert's slots (flat n * k + j) in token order.
  std::vector<std::vector<std::int64_t>> slots(static_cast<std::size_t>(e_count));
  for (std::int64_t s = 0; s < n * k; ++s) {
    KILN_CHECK(ip[s] >= 0 && ip[s] < e_count, "moe dispatch plan: expert index {} outside [0, {})", ip[s], e_count);
    slots[static_cast<std::size_t>(ip[s])].push_back(s);
  }
  std::fill(row, row + n * k, std::int64_t{-1});
  std::int64_t next = 0;
  for (std::int64_t e = 0; e < e_count; ++e) {
    std::vector<std::int64_t>& mine = slots[static_cast<std::size_t>(e)];
    tok[e] = static_cast<std::int64_t>(mine.size());
    if (capacity > 0 && tok[e] > capacity) {
      if (!drop_by_position) {  // the highest probs, then back to token order
        std::stable_sort(mine.begin(), mine.end(), [&](std::int64_t a, std::int64_t b) { return pp[a] > pp[b]; });
        mine.resize(static_cast<std::size_t>(capacity));
        std::sort(mine.begin(), mine.end());
      } else {
        mine.resize(static_cast<std::size_t>(capacity));
      }
    }
    drop[e] = tok[e] - static_cast<std::int64_t>(mine.size());
    off[e] = next;
    for (std::int64_t s : mine) {
      src[next] = s / k;
      row[s] = next++;
    }
    if (pad)
      while (next < off[e] + capacity) src[next++] = -1;
  }
  off[e_count] = next;
  KILN_CHECK(next <= rows, "moe dispatch plan: {} rows do not fit the buffer's {}", next, rows);
  std::fill(src + next, src + rows, std::int64_t{-1});
}

namespace {

// Routing probabilities of f32 or f64 (the reference path); undefined reads as 1.
class ProbsView {
 public:
  explicit ProbsView(const Tensor& t)
      : f32_(t.defined() && t.dtype() == DType::F32 ? static_cast<float*>(t.data_ptr()) : nullptr),
        f64_(t.defined() && t.dtype() == DType::F64 ? static_cast<double*>(t.data_ptr()) : nullptr) {
    KILN_CHECK(!t.defined() || f32_ || f64_, "moe unpermute: probs must be float32 or float64, got {}", t.describe());
  }
  bool defined() const { return f32_ || f64_; }
  double operator()(std::int64_t i) const { return f32_ ? f32_[i] : f64_ ? f64_[i] : 1.0; }
  void set(std::int64_t i, double v) const {
    if (f32_) f32_[i] = static_cast<float>(v);
    if (f64_) f64_[i] = v;
  }

 private:
  float* f32_;
  double* f64_;
};

}  // namespace

void moe_permute(const Tensor& x, const Tensor& src_token, const Tensor& out) {
  const std::int64_t h = x.shape()[1], rows = src_token.numel();
  const auto* src = static_cast<const std::int64_t*>(src_token.data_ptr());
  const std::size_t bytes = static_cast<std::size_t>(h) * dtype_size(x.dtype());
  const auto* xp = static_cast<const char*>(x.data_ptr());
  auto* op = static_cast<char*>(out.data_ptr());
  ops::cpu::parallel_for(rows, 16, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      char* dst = op + static_cast<std::size_t>(r) * bytes;
      if (src[r] < 0)
        std::fill(dst, dst + bytes, char{0});
      else
        std::copy(xp + static_cast<std::size_t>(src[r]) * bytes, xp + static_cast<std::size_t>(src[r] + 1) * bytes,
                  dst);
    }
  });
}

void moe_unpermute(const Tensor& in, const Tensor& row_of, const Tensor& probs, const Tensor& out) {
  const std::int64_t n = row_of.shape()[0], k = row_of.shape()[1], h = in.shape()[1];
  const auto* row = static_cast<const std::int64_t*>(row_of.data_ptr());
  KILN_DISPATCH_FLOATING(in.dtype(), "moe_unpermute", [&]<class T>() {
    using A = acc_t<T>;
    const ProbsView pp(probs);
    const T* ip = static_cast<const T*>(in.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    ops::cpu::parallel_for(n, 16, [&](std::int64_t lo, std::int64_t hi) {
      std::vector<A> acc(static_cast<std::size_t>(h));
      for (std::int64_t t = lo; t < hi; ++t) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int64_t r = row[t * k + j];
          if (r < 0) continue;
          const A w = static_cast<A>(pp(t * k + j));
          for (std::int64_t i = 0; i < h; ++i) acc[static_cast<std::size_t>(i)] += w * static_cast<A>(ip[r * h + i]);
        }
        for (std::int64_t i = 0; i < h; ++i) op[t * h + i] = from_acc<T>(acc[static_cast<std::size_t>(i)]);
      }
    });
  });
}

void moe_unpermute_backward(const Tensor& dout, const Tensor& in, const Tensor& row_of, const Tensor& probs,
                            const Tensor& din, const Tensor& dprobs) {
  const std::int64_t n = row_of.shape()[0], k = row_of.shape()[1], h = in.shape()[1], rows = in.shape()[0];
  const auto* row = static_cast<const std::int64_t*>(row_of.data_ptr());
  KILN_DISPATCH_FLOATING(in.dtype(), "moe_unpermute_backward", [&]<class T>() {
    using A = acc_t<T>;
    const ProbsView pp(probs);
    const ProbsView gp(dprobs);
    const T* dp = static_cast<const T*>(dout.data_ptr());
    const T* ip = static_cast<const T*>(in.data_ptr());
    T* dip = static_cast<T*>(din.data_ptr());
    std::fill(dip, dip + rows * h, from_acc<T>(A(0)));
    ops::cpu::parallel_for(n, 16, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t t = lo; t < hi; ++t)
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int64_t r = row[t * k + j];
          A dot = 0;
          if (r >= 0) {
            const A w = static_cast<A>(pp(t * k + j));
            for (std::int64_t i = 0; i < h; ++i) {
              const A g = static_cast<A>(dp[t * h + i]);
              dip[r * h + i] = from_acc<T>(w * g);
              dot += g * static_cast<A>(ip[r * h + i]);
            }
          }
          if (gp.defined()) gp.set(t * k + j, static_cast<double>(dot));
        }
    });
  });
}

namespace {

Tensor as_one_batch(const Tensor& m) { return m.view({1, m.shape()[0], m.shape()[1]}); }

std::vector<std::int64_t> read_offsets(const Tensor& offsets) {
  const auto* p = static_cast<const std::int64_t*>(offsets.data_ptr());
  return {p, p + offsets.numel()};
}

}  // namespace

void grouped_gemm(const Tensor& x, const Tensor& w, const Tensor& offsets, bool trans_w, const Tensor& y) {
  const std::vector<std::int64_t> off = read_offsets(offsets);
  const std::int64_t e_count = w.shape()[0], rows = x.shape()[0];
  for (std::int64_t e = 0; e < e_count; ++e) {
    const std::int64_t lo = off[static_cast<std::size_t>(e)], len = off[static_cast<std::size_t>(e) + 1] - lo;
    if (len == 0) continue;
    ops::gemm_into(as_one_batch(x.narrow(0, lo, len)), w.narrow(0, e, 1), as_one_batch(y.narrow(0, lo, len)), false,
                   !trans_w, 1.0, 0.0);
  }
  const std::int64_t used = off.back();
  if (used < rows) ops::fill(y.narrow(0, used, rows - used), 0.0);
}

void grouped_gemm_wgrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dw) {
  const std::vector<std::int64_t> off = read_offsets(offsets);
  const std::int64_t e_count = dw.shape()[0];
  for (std::int64_t e = 0; e < e_count; ++e) {
    const std::int64_t lo = off[static_cast<std::size_t>(e)], len = off[static_cast<std::size_t>(e) + 1] - lo;
    if (len == 0)
      ops::fill(dw.narrow(0, e, 1), 0.0);
    else
      ops::gemm_into(as_one_batch(dy.narrow(0, lo, len)), as_one_batch(x.narrow(0, lo, len)), dw.narrow(0, e, 1), true,
                     false, 1.0, 0.0);
  }
}

}  // namespace kiln::te::cpu
