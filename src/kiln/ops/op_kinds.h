#pragma once
// The operation codes shared by the op wrappers and every backend's kernels.
#include <cstdint>

namespace kiln::ops {

enum class UnaryOp : std::uint8_t {
  Neg,
  Abs,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Square,
  Reciprocal,
  Sin,
  Cos,
  Relu,
  Gelu,
  GeluTanh,
  Silu,
  Sigmoid,
  Tanh,
  PowScalar,  // x ** param
  LeakyRelu,  // param = negative slope
};

enum class BinaryOp : std::uint8_t {
  Add,
  Sub,
  Mul,
  Div,
  Pow,
  Maximum,
  Minimum,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,  // comparisons write bool
};

enum class ReduceOp : std::uint8_t { Sum, Mean, Max, Min, Prod };

enum class RandomKind : std::uint8_t { Uniform, Normal, Bernoulli };

struct Conv2dParams {
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int dilation_h = 1, dilation_w = 1;
  int groups = 1;
};

struct Pool2dParams {
  int kernel_h = 2, kernel_w = 2;
  int stride_h = 2, stride_w = 2;
  int pad_h = 0, pad_w = 0;
  bool count_include_pad = true;  // avg pool only
};

// Capturable optimizers (CUDA graphs) pass lr_ptr / step_ptr: float64 scalars in the parameters'
// device memory that the kernel reads when it runs, instead of the host values frozen into a
// captured launch. Same formulas either way, so both paths give the same parameters.
struct AdamParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled_weight_decay = false;  // AdamW
  std::int64_t step = 1;                // 1-based, after increment
  const double* lr_ptr = nullptr;       // when set, replaces lr
  const double* step_ptr = nullptr;     // when set, replaces step (a whole number >= 1)
  // When set: a float32 scalar in the parameters' device memory that every gradient is multiplied
  // by (in float32) as the step reads it: gradient clipping's coefficient without a pass of its own
  // over the gradients (optim::clip_coefficient). Read when the step runs, like lr_ptr.
  const float* grad_scale_ptr = nullptr;
};

struct SgdParams {
  double lr = 0.01, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = true;          // momentum buffer is initialised from the gradient
  const double* lr_ptr = nullptr;  // when set, replaces lr (see AdamParams)
};

}  // namespace kiln::ops
