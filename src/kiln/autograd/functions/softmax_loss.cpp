// Differentiable softmax / log_softmax (any dim), cross_entropy (fused log-softmax + NLL with
// label smoothing and ignore_index, mean over non-ignored rows) and mse_loss.
#include "kiln/ops/softmax_loss.h"

#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"

namespace kiln {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;
using ops::BinaryOp;

namespace {

Tensor softmax_impl(const Tensor& x, std::int64_t dim, bool log) {
  const char* node = log ? "LogSoftmaxBackward" : "SoftmaxBackward";
  if (x.dim() == 0) return softmax_impl(x.reshape({1}), 0, log).reshape({});
  const int d = wrap_dim(dim, x.dim(), log ? "log_softmax" : "softmax");
  if (d != x.dim() - 1) {
    // Move the dimension last (the kernel's layout), then move it back: both are views.
    return softmax_impl(x.transpose(d, -1), -1, log).transpose(d, -1);
  }
  Tensor y = ops::softmax_last(x, log);
  if (needs_grad({x})) {
    record(node, {x}, {&y}, [sy = SavedTensor(y.detach()), log](const Grads& g) -> Grads {
      if (!g[0].defined()) return {Tensor()};
      return {ops::softmax_last_backward(g[0], sy.get(log ? "log_softmax" : "softmax"), log)};
    });
  }
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, std::int64_t dim) { return softmax_impl(x, dim, false); }
Tensor log_softmax(const Tensor& x, std::int64_t dim) { return softmax_impl(x, dim, true); }

Tensor cross_entropy(const Tensor& logits, const Tensor& target, std::int64_t ignore_index, double label_smoothing) {
  KILN_CHECK(logits.defined() && target.defined(), "cross_entropy: input and target must be defined");
  KILN_CHECK(logits.dim() >= 1, "cross_entropy: input must have a class dimension, got {}", logits.describe());
  // [C] -> [1, C]; [N, C, d1, ...] -> [N * d1 * ..., C] with the target flattened to match.
  Tensor l2 = logits, t2 = target;
  if (logits.dim() == 1) {
    l2 = logits.unsqueeze(0);
    t2 = target.reshape({1});
  } else if (logits.dim() > 2) {
    std::vector<std::int64_t> perm{0};
    for (std::int64_t d = 2; d < logits.dim(); ++d) perm.push_back(d);
    perm.push_back(1);
    l2 = logits.permute(perm).reshape({-1, logits.shape()[1]});
    Shape expected = logits.shape();
    expected.erase(expected.begin() + 1);
    KILN_CHECK(target.shape() == expected, "cross_entropy: target {} does not match input {} (expected {})",
               target.describe(), logits.describe(), shape_str(expected));
    t2 = target.reshape({-1});
  }
  auto [rows, lse] = ops::cross_entropy_rows(l2, t2, ignore_index, label_smoothing);
  // Mean over the rows whose target is not ignore_index (computed on the device: no sync).
  const DType acc = logits.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Tensor valid = ops::to(ops::binary(BinaryOp::Ne, t2, static_cast<double>(ignore_index)), t2.device(), acc);
  Tensor count = ops::reduce(ops::ReduceOp::Sum, valid, {}, false);
  Tensor total = ops::to(ops::reduce(ops::ReduceOp::Sum, rows, {}, false), rows.device(), acc);
  Tensor loss = ops::to(ops::binary(BinaryOp::Div, total, count), logits.device(), logits.dtype());
  if (needs_grad({l2})) {
    record(
        "CrossEntropyBackward", {l2}, {&loss},
        [sl = SavedTensor(l2.detach()), t2, lse, count, ignore_index, label_smoothing, acc](const Grads& g) -> Grads {
          if (!g[0].defined()) return {Tensor()};
          const Tensor& lv = sl.get("cross_entropy");
          Tensor scale = ops::binary(BinaryOp::Div, ops::to(g[0], g[0].device(), acc), count);
          Tensor per_row = ops::contiguous(ops::broadcast_to(scale, t2.shape(), "cross_entropy"));
          return {ops::cross_entropy_rows_backward(per_row, lv, t2, lse, ignore_index, label_smoothing)};
        });
  }
  return loss;
}

Tensor mse_loss(const Tensor& input, const Tensor& target) {
  KILN_CHECK(input.defined() && target.defined(), "mse_loss: input and target must be defined");
  KILN_CHECK(input.shape() == target.shape(), "mse_loss: input {} and target {} must have the same shape",
             input.describe(), target.describe());
  return mean(square(sub(input, target)));
}

}  // namespace kiln
