// Tensor factories that fill values (zeros, ones, full, arange, rand, randn, scalar).
#include <cmath>

#include "kiln/ops/copy.h"
#include "kiln/ops/kernels.h"

namespace kiln {

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  ops::fill(t, 0.0);
  return t;
}

Tensor Tensor::ones(Shape shape, DType dtype, Device device) { return full(std::move(shape), 1.0, dtype, device); }

Tensor Tensor::full(Shape shape, double value, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  ops::fill(t, value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

Tensor Tensor::arange(double start, double end, double step, DType dtype, Device device) {
  KILN_CHECK(step != 0, "arange: step must be non-zero");
  KILN_CHECK((end - start) / step >= 0, "arange: the range [{}, {}) is empty or reversed for step {}", start, end,
             step);
  auto n = static_cast<std::int64_t>(std::ceil((end - start) / step));
  Tensor t = empty({n}, dtype, device);
  if (n) KILN_KERNEL(device, arange)(t, start, step);
  return t;
}

Tensor Tensor::rand(Shape shape, std::uint64_t seed, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  if (t.numel()) KILN_KERNEL(device, random)(t, ops::RandomKind::Uniform, seed, 0, 0.0, 1.0);
  return t;
}

Tensor Tensor::randn(Shape shape, std::uint64_t seed, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  if (t.numel()) KILN_KERNEL(device, random)(t, ops::RandomKind::Normal, seed, 0, 0.0, 1.0);
  return t;
}

Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype(), t.device()); }

}  // namespace kiln
