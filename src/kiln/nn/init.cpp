#include "kiln/nn/init.h"

#include <cmath>

#include "kiln/ops/copy.h"
#include "kiln/ops/kernels.h"

namespace kiln::nn::init {

namespace {

void fill_random(const Tensor& t, ops::RandomKind kind, double a, double b, Generator* gen) {
  KILN_CHECK(t.defined(), "nn::init: the tensor is undefined");
  KILN_CHECK(is_floating(t.dtype()), "nn::init: random initialisation needs a floating tensor, got {}", t.describe());
  if (t.numel() == 0) return;
  Generator& g = gen ? *gen : default_generator();
  RandomKey key = g.next(static_cast<std::uint64_t>(t.numel()));
  // The kernel writes contiguous memory; strided targets get a contiguous copy.
  Tensor dst = t.is_contiguous() ? t : Tensor::empty(t.shape(), t.dtype(), t.device());
  KILN_KERNEL(t.device(), random)(dst, kind, key.seed, key.offset, a, b);
  if (!dst.is_same(t)) ops::copy_into(t, dst);
  t.storage()->bump_version();
}

double fan_for(const Tensor& t, FanMode mode) {
  auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  std::int64_t fan = mode == FanMode::FanIn ? fan_in : fan_out;
  KILN_CHECK(fan > 0, "nn::init: zero fan for tensor {}", t.describe());
  return static_cast<double>(fan);
}

}  // namespace

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Conv:
    case Nonlinearity::Sigmoid: return 1.0;
    case Nonlinearity::Tanh: return 5.0 / 3.0;
    case Nonlinearity::ReLU: return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU: return std::sqrt(2.0 / (1.0 + param * param));
    case Nonlinearity::SELU: return 3.0 / 4.0;
  }
  return 1.0;
}

std::pair<std::int64_t, std::int64_t> fan_in_and_fan_out(const Tensor& t) {
  KILN_CHECK(t.dim() >= 2, "nn::init: fan in and fan out need a tensor of at least 2 dimensions, got {}", t.describe());
  std::int64_t receptive = 1;
  for (std::int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

const Tensor& uniform_(const Tensor& t, double a, double b, Generator* gen) {
  fill_random(t, ops::RandomKind::Uniform, a, b, gen);
  return t;
}

const Tensor& normal_(const Tensor& t, double mean, double std, Generator* gen) {
  fill_random(t, ops::RandomKind::Normal, mean, std, gen);
  return t;
}

const Tensor& constant_(const Tensor& t, double value) {
  KILN_CHECK(t.defined(), "nn::init::constant_: the tensor is undefined");
  ops::fill(t, value);
  t.storage()->bump_version();
  return t;
}

const Tensor& zeros_(const Tensor& t) { return constant_(t, 0.0); }
const Tensor& ones_(const Tensor& t) { return constant_(t, 1.0); }

const Tensor& kaiming_uniform_(const Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity, Generator* gen) {
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(fan_for(t, mode));
  const double bound = std::sqrt(3.0) * std;
  return uniform_(t, -bound, bound, gen);
}

const Tensor& kaiming_normal_(const Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity, Generator* gen) {
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(fan_for(t, mode));
  return normal_(t, 0.0, std, gen);
}

const Tensor& xavier_uniform_(const Tensor& t, double gain, Generator* gen) {
  auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  const double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  const double bound = std::sqrt(3.0) * std;
  return uniform_(t, -bound, bound, gen);
}

const Tensor& xavier_normal_(const Tensor& t, double gain, Generator* gen) {
  auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  const double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  return normal_(t, 0.0, std, gen);
}

void default_linear_init(const Tensor& weight, const Tensor& bias, Generator* gen) {
  kaiming_uniform_(weight, std::sqrt(5.0), FanMode::FanIn, Nonlinearity::LeakyReLU, gen);
  if (bias.defined()) {
    const std::int64_t fan_in = fan_in_and_fan_out(weight).first;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    uniform_(bias, -bound, bound, gen);
  }
}

}  // namespace kiln::nn::init
