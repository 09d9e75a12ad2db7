// Cases of the elementwise kernels: unary (+ backward), binary, binary_scalar, where, clamp.
#include <cmath>

#include "harness.h"
#include "kiln/autograd/functions.h"
#include "kiln/ops/elementwise.h"

namespace kiln::backend_ops {

namespace cases_elementwise {

using ops::BinaryOp;
using ops::UnaryOp;
using Fn1 = Tensor (*)(const Tensor&);

// A unary op through the differentiable API, with a direct float64 reference for the forward.
OpCase unary_case(const std::string& name, std::function<Tensor(const Tensor&)> f, double (*ref)(double),
                  std::function<Tensor(bool)> input) {
  OpCase c;
  c.name = "unary/" + name;
  c.kernels = {"unary", "unary_backward"};
  c.dtypes = {DType::F32, DType::BF16, DType::F16};
  c.inputs = [input](bool large) { return std::vector<Tensor>{input(large)}; };
  c.forward = [f](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; };
  c.grad_inputs = {0};
  c.reference = [ref](const std::vector<Tensor>& in) {
    auto v = in[0].to_vector<double>();
    for (double& x : v) x = ref(x);
    return std::vector<Tensor>{Tensor::from_vector(v, in[0].shape())};
  };
  return c;
}

Shape shape_of(bool large) { return large ? Shape{1024, 1024} : Shape{7, 13}; }

std::function<Tensor(bool)> normal(std::uint64_t seed, double scale = 1.0) {
  return [=](bool large) { return randn(shape_of(large), seed, scale); };
}
std::function<Tensor(bool)> positive(std::uint64_t seed) {
  return [=](bool large) { return rand_uniform(shape_of(large), seed, 0.5, 3.0); };
}

double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

OpCase binary_case(const std::string& name, std::function<Tensor(const Tensor&, const Tensor&)> f,
                   std::function<Tensor(bool)> a, std::function<Tensor(bool)> b, bool differentiable) {
  OpCase c;
  c.name = "binary/" + name;
  c.kernels = {"binary"};
  c.dtypes = {DType::F32, DType::BF16, DType::F16};
  c.inputs = [a, b](bool large) { return std::vector<Tensor>{a(large), b(large)}; };
  c.forward = [f](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0], in[1])}; };
  if (differentiable) c.grad_inputs = {0, 1};
  return c;
}

// Broadcast partner of shape_of: one row, so the backward reduces over the rows.
std::function<Tensor(bool)> row(std::uint64_t seed, double lo, double hi) {
  return [=](bool large) { return rand_uniform({large ? 1024 : 13}, seed, lo, hi); };
}
// Small whole numbers, so that comparisons see equal elements (exact in every float dtype).
std::function<Tensor(bool)> whole(std::uint64_t seed) {
  return [=](bool large) {
    auto v = randn(shape_of(large), seed, 2.0).to_vector<double>();
    for (double& x : v) x = std::round(x);
    return Tensor::from_vector(v, shape_of(large));
  };
}

}  // namespace cases_elementwise

void add_elementwise_cases(std::vector<OpCase>& cases) {
  using namespace cases_elementwise;  // this file's helpers (a named namespace: the tests compile in unity batches)
  cases.push_back(unary_case(
      "neg", static_cast<Fn1>(neg), [](double x) { return -x; }, normal(1)));
  cases.push_back(unary_case(
      "abs", static_cast<Fn1>(abs), [](double x) { return std::abs(x); }, normal(2)));
  cases.push_back(unary_case(
      "exp", static_cast<Fn1>(exp), [](double x) { return std::exp(x); }, normal(3)));
  cases.push_back(unary_case(
      "log", static_cast<Fn1>(log), [](double x) { return std::log(x); }, positive(4)));
  cases.push_back(unary_case(
      "sqrt", static_cast<Fn1>(sqrt), [](double x) { return std::sqrt(x); }, positive(5)));
  cases.push_back(unary_case(
      "rsqrt", static_cast<Fn1>(rsqrt), [](double x) { return 1 / std::sqrt(x); }, positive(6)));
  cases.push_back(unary_case(
      "square", static_cast<Fn1>(square), [](double x) { return x * x; }, normal(7)));
  cases.push_back(unary_case(
      "reciprocal", [](const Tensor& x) { return rdiv(1.0, x); }, [](double x) { return 1 / x; }, positive(8)));
  cases.push_back(unary_case(
      "sin", static_cast<Fn1>(sin), [](double x) { return std::sin(x); }, normal(9)));
  cases.push_back(unary_case(
      "cos", static_cast<Fn1>(cos), [](double x) { return std::cos(x); }, normal(10)));
  cases.push_back(unary_case(
      "relu", static_cast<Fn1>(relu), [](double x) { return x > 0 ? x : 0.0; }, normal(11)));
  cases.push_back(unary_case(
      "gelu", [](const Tensor& x) { return gelu(x); }, gelu_ref, normal(12)));
  cases.push_back(unary_case(
      "gelu_tanh", [](const Tensor& x) { return gelu(x, true); }, gelu_tanh_ref, normal(13)));
  cases.push_back(unary_case(
      "silu", static_cast<Fn1>(silu), [](double x) { return x / (1 + std::exp(-x)); }, normal(14)));
  cases.push_back(unary_case(
      "sigmoid", static_cast<Fn1>(sigmoid), [](double x) { return 1 / (1 + std::exp(-x)); }, normal(15)));
  cases.push_back(unary_case(
      "tanh", static_cast<Fn1>(tanh), [](double x) { return std::tanh(x); }, normal(16)));
  cases.push_back(unary_case(
      "pow_scalar", [](const Tensor& x) { return pow(x, 2.5); }, [](double x) { return std::pow(x, 2.5); },
      positive(17)));
  cases.push_back(unary_case(
      "leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.1); }, [](double x) { return x > 0 ? x : 0.1 * x; },
      normal(18)));

  using Fn2 = Tensor (*)(const Tensor&, const Tensor&);
  cases.push_back(binary_case("add", static_cast<Fn2>(add), normal(20), row(21, -1, 1), true));
  cases.push_back(binary_case("sub", static_cast<Fn2>(sub), normal(22), row(23, -1, 1), true));
  cases.push_back(binary_case("mul", static_cast<Fn2>(mul), normal(24), row(25, -2, 2), true));
  cases.push_back(binary_case("div", static_cast<Fn2>(div), normal(26), row(27, 0.5, 2), true));
  cases.push_back(binary_case("pow", static_cast<Fn2>(pow), positive(28), row(29, 0.5, 2), true));
  // Maximum/minimum: the operands never tie (a on a 0.05 grid, b on the grid shifted by 0.025).
  auto grid = [](std::uint64_t seed, double shift) {
    return [=](bool large) {
      auto v = distinct(shape_of(large), seed).to_vector<double>();
      for (double& x : v) x += shift;
      return Tensor::from_vector(v, shape_of(large));
    };
  };
  cases.push_back(binary_case("maximum", maximum, grid(30, 0), grid(31, 0.025), true));
  cases.push_back(binary_case("minimum", minimum, grid(32, 0), grid(33, 0.025), true));
  const std::pair<const char*, BinaryOp> comparisons[] = {{"eq", BinaryOp::Eq}, {"ne", BinaryOp::Ne},
                                                          {"lt", BinaryOp::Lt}, {"le", BinaryOp::Le},
                                                          {"gt", BinaryOp::Gt}, {"ge", BinaryOp::Ge}};
  std::uint64_t seed = 40;
  for (const auto& [name, op] : comparisons) {
    BinaryOp o = op;
    cases.push_back(binary_case(
        name, [o](const Tensor& a, const Tensor& b) { return ops::binary(o, a, b); }, whole(seed), whole(seed + 1),
        false));
    seed += 2;
  }

  const std::pair<const char*, std::function<Tensor(const Tensor&)>> scalar_ops[] = {
      {"add", [](const Tensor& x) { return add(x, 2.5); }},
      {"sub", [](const Tensor& x) { return sub(x, 0.75); }},
      {"mul", [](const Tensor& x) { return mul(x, -1.5); }},
      {"div", [](const Tensor& x) { return div(x, 3.0); }},
      {"pow", [](const Tensor& x) { return ops::binary(BinaryOp::Pow, x, 1.5); }},
      {"maximum", [](const Tensor& x) { return ops::binary(BinaryOp::Maximum, x, 0.3); }},
      {"gt", [](const Tensor& x) { return ops::binary(BinaryOp::Gt, x, 1.0); }},
  };
  for (const auto& [name, f] : scalar_ops) {
    OpCase c;
    c.name = std::string("binary_scalar/") + name;
    c.kernels = {"binary_scalar"};
    c.dtypes = {DType::F32, DType::BF16, DType::F16};
    const bool pos = std::string(name) == "pow";
    c.inputs = [pos](bool large) { return std::vector<Tensor>{pos ? positive(50)(large) : whole(51)(large)}; };
    auto fn = f;
    c.forward = [fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; };
    // The autograd versions (add/sub/mul/div) are differentiable; the raw ops are not.
    const std::string n = name;
    if (n == "add" || n == "sub" || n == "mul" || n == "div") c.grad_inputs = {0};
    cases.push_back(std::move(c));
  }

  {
    OpCase c;
    c.name = "where";
    c.kernels = {"where"};
    c.dtypes = {DType::F32, DType::BF16};
    c.inputs = [](bool large) {
      Tensor cond = ops::binary(BinaryOp::Gt, randn(shape_of(large), 60), 0.0);
      return std::vector<Tensor>{cond, randn(shape_of(large), 61), randn({large ? 1024 : 13}, 62)};
    };
    c.forward = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{where(in[0], in[1], in[2])}; };
    c.grad_inputs = {1, 2};
    cases.push_back(std::move(c));
  }
  {
    OpCase c;
    c.name = "clamp";
    c.kernels = {"clamp"};
    c.dtypes = {DType::F32, DType::BF16, DType::F16};
    // On the 0.05 grid, offset so that no element sits on a bound.
    c.inputs = [](bool large) {
      auto v = distinct(shape_of(large), 63).to_vector<double>();
      for (double& x : v) x += 0.0125;
      return std::vector<Tensor>{Tensor::from_vector(v, shape_of(large))};
    };
    c.forward = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{clamp(in[0], -0.5, 0.7)}; };
    c.grad_inputs = {0};
    c.reference = [](const std::vector<Tensor>& in) {
      auto v = in[0].to_vector<double>();
      for (double& x : v) x = std::min(0.7, std::max(-0.5, x));
      return std::vector<Tensor>{Tensor::from_vector(v, in[0].shape())};
    };
    cases.push_back(std::move(c));
  }
}

}  // namespace kiln::backend_ops
