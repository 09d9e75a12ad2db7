#include "kiln/autograd/gradcheck.h"

#include <cmath>

#include "kiln/autograd/functions.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::autograd {

namespace {
double weighted_sum(const Tensor& y, const Tensor& w) { return sum(mul(y.to(DType::F64), w)).item(); }
}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs,
                          double eps, double atol, double rtol) {
  GradcheckResult result;
  for (auto& in : inputs)
    if (in.defined() && is_floating(in.dtype())) in.requires_grad_(true);
  Tensor y = f(inputs);
  Tensor w = Tensor::randn(y.shape(), 12345, DType::F64, y.device());
  Tensor loss = sum(mul(y.to(DType::F64), w));
  loss.backward();

  NoGradGuard no_grad;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Tensor& x = inputs[i];
    if (!x.defined() || !x.requires_grad()) continue;
    Tensor analytical =
        x.grad().defined() ? x.grad().to(Device::cpu(), DType::F64) : Tensor::zeros(x.shape(), DType::F64);
    auto a = analytical.to_vector<double>();
    // Perturb a host copy and write it back for each element (works on every device).
    Tensor host = x.to(Device::cpu(), x.dtype()).clone();
    auto values = host.to_vector<double>();
    for (std::size_t j = 0; j < values.size(); ++j) {
      double orig = values[j];
      auto eval = [&](double v) {
        values[j] = v;
        x.copy_(Tensor::from_vector(values, x.shape()).to(x.dtype()));
        return weighted_sum(f(inputs), w);
      };
      double numerical = (eval(orig + eps) - eval(orig - eps)) / (2 * eps);
      values[j] = orig;
      x.copy_(Tensor::from_vector(values, x.shape()).to(x.dtype()));
      double err = std::abs(numerical - a[j]);
      result.max_abs_error = std::max(result.max_abs_error, err);
      if (err > atol + rtol * std::abs(numerical) && result.ok) {
        result.ok = false;
        result.message = fmt::format("input {} element {}: analytical {} vs numerical {}", i, j, a[j], numerical);
      }
    }
  }
  return result;
}

}  // namespace kiln::autograd
