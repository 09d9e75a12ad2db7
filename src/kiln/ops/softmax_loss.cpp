#include "kiln/ops/softmax_loss.h"

#include "kiln/ops/checks.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/kernels.h"

namespace kiln::ops {

Tensor softmax_last(const Tensor& x, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_defined(op, x, "input");
  check_floating(op, x);
  Tensor y = empty_like(x);
  if (y.numel()) KILN_KERNEL(x.device(), softmax_forward)(contiguous(x), log, y);
  return y;
}

Tensor softmax_last_backward(const Tensor& grad_y, const Tensor& y, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_compatible(op, grad_y, y);
  KILN_CHECK(grad_y.shape() == y.shape(), "{}: grad_output {} does not match output {}", op, grad_y.describe(),
             y.describe());
  Tensor gx = empty_like(y);
  if (gx.numel()) KILN_KERNEL(y.device(), softmax_backward)(contiguous(grad_y), contiguous(y), log, gx);
  return gx;
}

namespace {
void check_ce(const Tensor& logits, const Tensor& target, double label_smoothing) {
  check_defined("cross_entropy", logits, "input");
  check_defined("cross_entropy", target, "target");
  check_floating("cross_entropy", logits);
  check_same_device("cross_entropy", logits, target);
  check_dim("cross_entropy", logits, 2, "input [N, C]");
  KILN_CHECK(target.dtype() == DType::I64, "cross_entropy: target must be int64 class indices, got {}",
             target.describe());
  KILN_CHECK(target.dim() == 1 && target.shape()[0] == logits.shape()[0],
             "cross_entropy: target {} does not match input {} (expected [{}])", target.describe(), logits.describe(),
             logits.shape()[0]);
  KILN_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
             "cross_entropy: label_smoothing must be in [0, 1], got {}", label_smoothing);
}
}  // namespace

std::pair<Tensor, Tensor> cross_entropy_rows(const Tensor& logits, const Tensor& target, std::int64_t ignore_index,
                                             double label_smoothing) {
  check_ce(logits, target, label_smoothing);
  const std::int64_t n = logits.shape()[0];
  Tensor loss = Tensor::empty({n}, logits.dtype(), logits.device());
  Tensor lse = Tensor::empty({n}, DType::F32, logits.device());
  if (n == 0) return {loss, lse};
  KILN_CHECK(logits.shape()[1] > 0, "cross_entropy: input {} has no classes", logits.describe());
  KILN_KERNEL(logits.device(), cross_entropy_forward)
  (contiguous(logits), contiguous(target), ignore_index, label_smoothing, loss, lse);
  return {loss, lse};
}

Tensor cross_entropy_rows_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target,
                                   const Tensor& lse, std::int64_t ignore_index, double label_smoothing) {
  check_ce(logits, target, label_smoothing);
  KILN_CHECK(grad_loss.shape() == target.shape(), "cross_entropy_backward: grad_loss {} does not match target {}",
             grad_loss.describe(), target.describe());
  Tensor gx = empty_like(logits);
  if (gx.numel() == 0) return gx;
  KILN_KERNEL(logits.device(), cross_entropy_backward)
  (contiguous(to(grad_loss, logits.device(), logits.dtype())), contiguous(logits), contiguous(target), contiguous(lse),
   ignore_index, label_smoothing, gx);
  return gx;
}

}  // namespace kiln::ops
