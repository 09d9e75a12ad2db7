#include "kiln/train/nonfinite_guard.h"

#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/kernels.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::train {

namespace {
constexpr double kNone = 4611686018427387904.0;  // 2^62: no step number reaches it; exact in double
}

NonFiniteGuard::NonFiniteGuard(Device device)
    : device_(device),
      steps_(Tensor::zeros({}, DType::I64, device)),
      first_bad_(Tensor::full({}, kNone, DType::I64, device)),
      none_(Tensor::full({}, kNone, DType::I64, device)) {}

void NonFiniteGuard::record(const Tensor& loss, const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(ops::contiguous(p.grad()));
  Tensor squares;
  if (!grads.empty()) {
    squares = Tensor::empty({}, DType::F32, device_);
    KILN_KERNEL(device_, sum_of_squares)(grads, squares);
  }
  record_squares(loss, squares);
}

void NonFiniteGuard::record_squares(const Tensor& loss, const Tensor& squares) {
  NoGradGuard no_grad;
  ops::binary_(ops::BinaryOp::Add, steps_, 1.0);
  Tensor total = ops::to(loss.detach(), device_, DType::F32);
  if (squares.defined()) total = ops::binary(ops::BinaryOp::Add, total, ops::to(squares, device_, DType::F32));
  // total * 0 is 0 for a finite total and NaN for NaN or inf; NaN != 0.
  Tensor bad = ops::binary(ops::BinaryOp::Ne, ops::binary(ops::BinaryOp::Mul, total, 0.0), 0.0);
  ops::binary_(ops::BinaryOp::Minimum, first_bad_, ops::where(bad, steps_, none_));
}

std::optional<std::int64_t> NonFiniteGuard::first_bad_step() const {
  const double v = first_bad_.item();
  if (v >= kNone) return std::nullopt;
  return static_cast<std::int64_t>(v);
}

}  // namespace kiln::train
