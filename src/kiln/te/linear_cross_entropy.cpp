#include "kiln/te/linear_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/reduce.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te {

namespace {

constexpr const char* kOp = "linear_cross_entropy";

void check_inputs(const Tensor& hidden, const Tensor& weight, const Tensor& labels, const Tensor& mask,
                  const LinearCrossEntropyOptions& o) {
  KILN_CHECK(hidden.defined() && weight.defined() && labels.defined(), "{}: hidden, weight and labels are required",
             kOp);
  KILN_CHECK(is_floating(hidden.dtype()) && hidden.dim() == 2, "{}: hidden must be a floating [N, H] tensor, got {}",
             kOp, hidden.describe());
  KILN_CHECK(weight.dim() == 2 && weight.shape()[1] == hidden.shape()[1] && weight.shape()[0] > 0,
             "{}: weight must be [V, H] with H = {} (hidden's), got {}", kOp, hidden.shape()[1], weight.describe());
  KILN_CHECK(weight.dtype() == hidden.dtype() && weight.device() == hidden.device(),
             "{}: weight ({}) must have hidden's dtype and device ({})", kOp, weight.describe(), hidden.describe());
  KILN_CHECK(labels.dtype() == DType::I64 && labels.dim() == 1 && labels.shape()[0] == hidden.shape()[0] &&
                 labels.device() == hidden.device(),
             "{}: labels must be int64 [{}] on {}, got {}", kOp, hidden.shape()[0], hidden.device().str(),
             labels.describe());
  if (mask.defined())
    KILN_CHECK(is_floating(mask.dtype()) && mask.dim() == 1 && mask.shape()[0] == hidden.shape()[0] &&
                   mask.device() == hidden.device(),
               "{}: loss_mask must be floating [{}] on {}, got {}", kOp, hidden.shape()[0], hidden.device().str(),
               mask.describe());
  KILN_CHECK(o.max_chunk_bytes > 0, "{}: max_chunk_bytes must be positive, got {}", kOp, o.max_chunk_bytes);
}

// Each row's weight mask_i / sum(mask) in the accumulation dtype on the device. Reads labels and
// mask on the host: an out-of-range label is refused here (a device kernel cannot throw), with
// the row and the value.
Tensor row_weights(const Tensor& labels, const Tensor& mask, std::int64_t vocab, DType acc,
                   const LinearCrossEntropyOptions& o) {
  const std::vector<std::int64_t> lab = labels.to_vector<std::int64_t>();
  std::vector<double> m = mask.defined() ? mask.to_vector<double>() : std::vector<double>(lab.size(), 1.0);
  double denom = 0;
  for (std::size_t i = 0; i < lab.size(); ++i) {
    KILN_CHECK(std::isfinite(m[i]) && m[i] >= 0, "{}: loss_mask[{}] is {} (expected a finite value >= 0)", kOp, i,
               m[i]);
    if (lab[i] == o.ignore_index) m[i] = 0;
    if (m[i] == 0) continue;
    KILN_CHECK(lab[i] >= 0 && lab[i] < vocab, "{}: labels[{}] is {}, outside the vocabulary [0, {}) of weight", kOp, i,
               lab[i], vocab);
    denom += m[i];
  }
  KILN_CHECK(lab.empty() || denom > 0,
             "{}: loss_mask (with labels equal to ignore_index {}) selects no token: the mean is undefined", kOp,
             o.ignore_index);
  for (double& v : m) v /= denom;
  return ops::to(Tensor::from_vector(m, {static_cast<std::int64_t>(m.size())}), labels.device(), acc);
}

Tensor batch(const Tensor& m) { return m.view({1, m.shape()[0], m.shape()[1]}); }

}  // namespace

Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& labels, const Tensor& loss_mask) {
  return linear_cross_entropy(hidden, weight, labels, loss_mask, LinearCrossEntropyOptions{});
}

Tensor linear_cross_entropy(const Tensor& hidden_in, const Tensor& weight_in, const Tensor& labels_in,
                            const Tensor& loss_mask, const LinearCrossEntropyOptions& o) {
  check_inputs(hidden_in, weight_in, labels_in, loss_mask, o);
  const Tensor hidden = ops::contiguous(hidden_in), weight = ops::contiguous(weight_in),
               labels = ops::contiguous(labels_in);
  const std::int64_t n = hidden.shape()[0], h = hidden.shape()[1], vocab = weight.shape()[0];
  const DType t = hidden.dtype(), acc = t == DType::F64 ? DType::F64 : DType::F32;
  const Device dev = hidden.device();
  KILN_CHECK(n > 0, "{}: hidden has no rows ({}): the mean is undefined", kOp, hidden.describe());
  const Tensor row_weight = row_weights(labels, loss_mask, vocab, acc, o);

  const bool want_dh = autograd::needs_grad({hidden_in}), want_dw = autograd::needs_grad({weight_in});
  Tensor dh = want_dh ? Tensor::empty({n, h}, t, dev) : Tensor();
  Tensor dw = want_dw ? Tensor::empty({vocab, h}, t, dev) : Tensor();  // the first chunk's GEMM writes it whole
  Tensor loss_rows = Tensor::empty({n}, acc, dev);

  const std::int64_t row_bytes = vocab * static_cast<std::int64_t>(dtype_size(t));
  const std::int64_t chunk = std::clamp<std::int64_t>(o.max_chunk_bytes / row_bytes, 1, n);
  Tensor logits_buffer = Tensor::empty({chunk, vocab}, t, dev);
  const auto kernel = ops::kernel(fused_ops().cross_entropy_chunk, dev, t);
  for (std::int64_t r0 = 0; r0 < n; r0 += chunk) {
    const std::int64_t rows = std::min(chunk, n - r0);
    const Tensor logits = logits_buffer.narrow(0, 0, rows);
    const Tensor h_chunk = hidden.narrow(0, r0, rows);
    ops::gemm_into(batch(h_chunk), batch(weight), batch(logits), false, true, 1.0, 0.0);
    kernel(logits, labels.narrow(0, r0, rows), row_weight.narrow(0, r0, rows), loss_rows.narrow(0, r0, rows),
           want_dh || want_dw);
    // logits now holds this chunk's d loss / d logits.
    if (want_dh) ops::gemm_into(batch(logits), batch(weight), batch(dh.narrow(0, r0, rows)), false, false, 1.0, 0.0);
    if (want_dw) ops::gemm_into(batch(logits), batch(h_chunk), batch(dw), true, false, 1.0, r0 == 0 ? 0.0 : 1.0);
  }
  Tensor loss = ops::reduce(ops::ReduceOp::Sum, loss_rows, {0}, false);
  if (want_dh || want_dw)
    autograd::record("LinearCrossEntropyBackward", {hidden_in, weight_in}, {&loss},
                     [dh, dw, t](const autograd::Grads& g) -> autograd::Grads {
                       if (!g[0].defined()) return {Tensor(), Tensor()};
                       const Tensor scale = ops::to(g[0], g[0].device(), t);
                       return {dh.defined() ? ops::binary(ops::BinaryOp::Mul, dh, scale) : Tensor(),
                               dw.defined() ? ops::binary(ops::BinaryOp::Mul, dw, scale) : Tensor()};
                     });
  return loss;
}

}  // namespace kiln::te
