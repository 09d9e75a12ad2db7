#pragma once
// Parameter initialisers (torch.nn.init). Each fills `t` in place (no autograd) and returns it.
// Random ones draw a (seed, offset) range from `gen` (the default generator when null), so after
// kiln::manual_seed(s) the same construction order gives the same values on every device.
#include <cstdint>
#include <utility>

#include "kiln/tensor/random_generator.h"
#include "kiln/tensor/tensor.h"

namespace kiln::nn::init {

enum class FanMode { FanIn, FanOut };
enum class Nonlinearity { Linear, Conv, Sigmoid, Tanh, ReLU, LeakyReLU, SELU };

// torch.nn.init.calculate_gain; `param` is leaky_relu's negative slope (default 0.01).
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);
// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field (2-D or more).
std::pair<std::int64_t, std::int64_t> fan_in_and_fan_out(const Tensor& t);

const Tensor& uniform_(const Tensor& t, double a = 0.0, double b = 1.0, Generator* gen = nullptr);
const Tensor& normal_(const Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
const Tensor& constant_(const Tensor& t, double value);
const Tensor& zeros_(const Tensor& t);
const Tensor& ones_(const Tensor& t);
// Kaiming/He: std = gain / sqrt(fan); uniform bound = sqrt(3) * std. `a` is the leaky_relu slope.
const Tensor& kaiming_uniform_(const Tensor& t, double a = 0.0, FanMode mode = FanMode::FanIn,
                               Nonlinearity nonlinearity = Nonlinearity::LeakyReLU, Generator* gen = nullptr);
const Tensor& kaiming_normal_(const Tensor& t, double a = 0.0, FanMode mode = FanMode::FanIn,
                              Nonlinearity nonlinearity = Nonlinearity::LeakyReLU, Generator* gen = nullptr);
// Xavier/Glorot: std = gain * sqrt(2 / (fan_in + fan_out)).
const Tensor& xavier_uniform_(const Tensor& t, double gain = 1.0, Generator* gen = nullptr);
const Tensor& xavier_normal_(const Tensor& t, double gain = 1.0, Generator* gen = nullptr);

// PyTorch's default for nn.Linear / nn.Conv2d: weight kaiming_uniform_(a = sqrt(5)) (bound
// 1/sqrt(fan_in)), bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)). `bias` may be undefined.
void default_linear_init(const Tensor& weight, const Tensor& bias, Generator* gen = nullptr);

}  // namespace kiln::nn::init
