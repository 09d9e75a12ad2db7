#include "kiln/optim/clip_grad.h"

#include <map>
#include <tuple>

#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/kernels.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::optim {

std::vector<Tensor> gradients_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

Tensor sum_of_squares(const std::vector<Tensor>& grads) {
  NoGradGuard no_grad;
  if (grads.empty()) return Tensor::zeros({}, DType::F32);
  const Device home = grads[0].device();
  std::map<std::pair<int, int>, std::vector<Tensor>> per_device;
  for (const Tensor& g : grads)
    per_device[{static_cast<int>(g.device().kind), g.device().index}].push_back(ops::contiguous(g));
  Tensor total;
  for (auto& [key, list] : per_device) {
    const Device d = list[0].device();
    Tensor sq = Tensor::empty({}, DType::F32, d);
    KILN_KERNEL(d, sum_of_squares)(list, sq);
    sq = ops::to(sq, home, DType::F32);
    total = total.defined() ? ops::binary(ops::BinaryOp::Add, total, sq) : sq;
  }
  return total;
}

namespace {

Tensor total_norm(const std::vector<Tensor>& grads) { return ops::unary(ops::UnaryOp::Sqrt, sum_of_squares(grads)); }

}  // namespace

Tensor grad_norm(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  return total_norm(gradients_of(params));
}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  NoGradGuard no_grad;
  std::vector<Tensor> grads = gradients_of(params);
  Tensor norm = total_norm(grads);
  if (grads.empty()) return norm;
  clip_to_norm_(grads, norm, max_norm);
  return norm;
}

void clip_to_norm_(const std::vector<Tensor>& grads, const Tensor& norm, double max_norm) {
  NoGradGuard no_grad;
  const Tensor coef = clip_coefficient(norm, max_norm);
  std::map<std::tuple<int, int, int>, Tensor> coef_for;
  for (const Tensor& g : grads) {
    auto key = std::make_tuple(static_cast<int>(g.device().kind), g.device().index, static_cast<int>(g.dtype()));
    auto it = coef_for.find(key);
    if (it == coef_for.end()) it = coef_for.emplace(key, ops::to(coef, g.device(), g.dtype())).first;
    ops::binary_(ops::BinaryOp::Mul, g, it->second);
    g.storage()->bump_version();
  }
}

Tensor clip_coefficient(const Tensor& norm, double max_norm) {
  NoGradGuard no_grad;
  // Computed on the device: no host round trip.
  return ops::clamp(ops::binary(ops::BinaryOp::Div, Tensor::scalar(max_norm, DType::F32, norm.device()),
                                ops::binary(ops::BinaryOp::Add, norm, 1e-6)),
                    0.0, 1.0);
}

}  // namespace kiln::optim
