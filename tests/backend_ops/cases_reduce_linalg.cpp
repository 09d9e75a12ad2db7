// Cases of the reduction and GEMM kernels: reduce, variance, arg_reduce, gemm.
#include "harness.h"
#include "kiln/autograd/functions.h"
#include "kiln/ops/reduce.h"

namespace kiln::backend_ops {

namespace cases_reduce_linalg {

OpCase reduce_case(const std::string& name, std::vector<std::string> kernels, std::function<Tensor(const Tensor&)> f,
                   std::function<Tensor(bool)> input, bool differentiable) {
  OpCase c;
  c.name = name;
  c.kernels = std::move(kernels);
  c.dtypes = {DType::F32, DType::BF16, DType::F16};
  c.inputs = [input](bool large) { return std::vector<Tensor>{input(large)}; };
  c.forward = [f](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; };
  if (differentiable) c.grad_inputs = {0};
  return c;
}

Shape shape3(bool large) { return large ? Shape{64, 256, 64} : Shape{3, 17, 5}; }

// A direct float64 matmul of [B, M, K] x [B, K, N] (2-D operands are one batch).
Tensor matmul_ref(const Tensor& a, const Tensor& b) {
  const bool batched = a.dim() == 3;
  const std::int64_t bs = batched ? a.shape()[0] : 1, m = a.shape()[a.dim() - 2], k = a.shape()[a.dim() - 1],
                     n = b.shape()[b.dim() - 1];
  auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> out(static_cast<std::size_t>(bs * m * n), 0.0);
  for (std::int64_t p = 0; p < bs; ++p)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t q = 0; q < k; ++q)
          s += av[static_cast<std::size_t>((p * m + i) * k + q)] * bv[static_cast<std::size_t>((p * k + q) * n + j)];
        out[static_cast<std::size_t>((p * m + i) * n + j)] = s;
      }
  return Tensor::from_vector(out, batched ? Shape{bs, m, n} : Shape{m, n});
}

}  // namespace cases_reduce_linalg

void add_reduce_linalg_cases(std::vector<OpCase>& cases) {
  using namespace cases_reduce_linalg;  // this file's helpers (a named namespace: the tests compile in unity batches)
  auto normal = [](std::uint64_t seed) { return [=](bool large) { return randn(shape3(large), seed); }; };
  auto spread = [](std::uint64_t seed) { return [=](bool large) { return distinct(shape3(large), seed); }; };
  {
    OpCase c = reduce_case(
        "reduce/sum_dim1", {"reduce"}, [](const Tensor& x) { return sum(x, {1}); }, normal(70), true);
    c.reference = [](const std::vector<Tensor>& in) {
      const auto& s = in[0].shape();
      auto v = in[0].to_vector<double>();
      std::vector<double> out(static_cast<std::size_t>(s[0] * s[2]), 0.0);
      for (std::int64_t i = 0; i < s[0]; ++i)
        for (std::int64_t j = 0; j < s[1]; ++j)
          for (std::int64_t k = 0; k < s[2]; ++k)
            out[static_cast<std::size_t>(i * s[2] + k)] += v[static_cast<std::size_t>((i * s[1] + j) * s[2] + k)];
      return std::vector<Tensor>{Tensor::from_vector(out, {s[0], s[2]})};
    };
    cases.push_back(std::move(c));
  }
  {
    // A linear layer's bias gradient: the column sums of [rows, out], which CUDA runs on 16-byte
    // packs of outputs (large: GPT-2's qkv width over 4,099 rows, several chunks and a short last one).
    OpCase c = reduce_case(
        "reduce/sum_dim0_columns", {"reduce"}, [](const Tensor& x) { return sum(x, {0}); },
        [](bool large) {
          return randn(large ? Shape{4099, 2304} : Shape{37, 24}, 77);
        },
        true);
    c.reference = [](const std::vector<Tensor>& in) {
      const std::int64_t rows = in[0].shape()[0], cols = in[0].shape()[1];
      auto v = in[0].to_vector<double>();
      std::vector<double> out(static_cast<std::size_t>(cols), 0.0);
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j)
          out[static_cast<std::size_t>(j)] += v[static_cast<std::size_t>(i * cols + j)];
      return std::vector<Tensor>{Tensor::from_vector(out, {cols})};
    };
    cases.push_back(std::move(c));
  }
  cases.push_back(reduce_case(
      "reduce/sum_all", {"reduce"}, [](const Tensor& x) { return sum(x); }, normal(71), true));
  cases.push_back(reduce_case(
      "reduce/mean_dims02", {"reduce"},
      [](const Tensor& x) {
        return mean(x, {0, 2}, true);
      },
      normal(72), true));
  cases.push_back(reduce_case(
      "reduce/amax_dim2", {"reduce"}, [](const Tensor& x) { return amax(x, {2}); }, spread(73), true));
  cases.push_back(reduce_case(
      "reduce/amin_dim0", {"reduce"}, [](const Tensor& x) { return amin(x, {0}); }, spread(74), true));
  cases.push_back(reduce_case(
      "reduce/prod_dim1", {"reduce"}, [](const Tensor& x) { return ops::reduce(ops::ReduceOp::Prod, x, {1}, false); },
      [](bool large) { return rand_uniform(shape3(large), 75, 0.9, 1.1); }, false));
  cases.push_back(reduce_case(
      "variance/unbiased_dim1", {"variance"}, [](const Tensor& x) { return var(x, {1}); }, normal(76), true));
  cases.push_back(reduce_case(
      "variance/biased_dims12", {"variance"},
      [](const Tensor& x) {
        return var(x, {1, 2}, 0, true);
      },
      normal(77), true));
  cases.push_back(reduce_case(
      "arg_reduce/argmax_dim1", {"arg_reduce"}, [](const Tensor& x) { return argmax(x, 1); }, spread(78), false));
  cases.push_back(reduce_case(
      "arg_reduce/argmin_dim2", {"arg_reduce"}, [](const Tensor& x) { return argmin(x, 2, true); }, spread(79), false));

  auto gemm_case = [](const std::string& name, Shape sa, Shape sb, Shape la, Shape lb,
                      std::function<Tensor(const Tensor&, const Tensor&)> f, bool direct) {
    OpCase c;
    c.name = "gemm/" + name;
    c.kernels = {"gemm"};
    c.dtypes = {DType::F32, DType::BF16, DType::F16};
    c.inputs = [=](bool large) { return std::vector<Tensor>{randn(large ? la : sa, 80), randn(large ? lb : sb, 81)}; };
    c.forward = [f](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0], in[1])}; };
    c.grad_inputs = {0, 1};  // the backward runs the transposed GEMMs
    if (direct)
      c.reference = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul_ref(in[0], in[1])}; };
    return c;
  };
  cases.push_back(gemm_case("matmul", {5, 7}, {7, 3}, {1024, 1024}, {1024, 1024}, matmul, true));
  cases.push_back(gemm_case("bmm", {2, 4, 6}, {2, 6, 3}, {8, 512, 256}, {8, 256, 512}, bmm, true));
  {
    OpCase c;
    c.name = "gemm/linear";
    c.kernels = {"gemm", "gemm_bias", "reduce"};
    c.dtypes = {DType::F32, DType::BF16};
    c.inputs = [](bool large) {
      const std::int64_t n = large ? 4096 : 4, in = large ? 1024 : 6, out = large ? 1024 : 3;
      return std::vector<Tensor>{randn({n, in}, 82), randn({out, in}, 83), randn({out}, 84)};
    };
    c.forward = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{linear(in[0], in[1], in[2])}; };
    c.grad_inputs = {0, 1, 2};
    cases.push_back(std::move(c));
  }
}

}  // namespace kiln::backend_ops
