#pragma once
// Finite-difference gradient check: compares the autograd gradient of sum(f(inputs) * w) (w a
// fixed random weighting, so every output element matters) against central differences.
// Use float64 inputs; the check works on any device (it reads values through the host).
#include <functional>
#include <string>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::autograd {

struct GradcheckResult {
  bool ok = true;
  double max_abs_error = 0;
  std::string message;  // the first mismatch: input, element, analytical vs numerical
};

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs,
                          double eps = 1e-6, double atol = 1e-5, double rtol = 1e-3);

}  // namespace kiln::autograd
