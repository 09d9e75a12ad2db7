// The bias_gelu extension: op declarations, the CPU kernels, and the entry point Kiln calls when
// it loads the library. The CUDA kernels are in op_kernel.cu (compiled by nvcc).
#include "op.h"

#include <kiln/runtime/backend.h>

#include <cmath>
#include <vector>

#if BIAS_GELU_WITH_CUDA
#include "op_kernel.h"
#endif

namespace bias_gelu {

namespace {

using kiln::Attrs;
using kiln::DeviceKind;
using kiln::DType;
using kiln::Tensor;

// Checks x [..., C] and bias [C] and returns them contiguous, with the row count.
struct Args {
  Tensor x, bias;
  std::int64_t rows = 0, cols = 0;
};

Args check_args(const char* op, const Tensor& x, const Tensor& bias) {
  KILN_CHECK(x.dim() >= 1, "{}: x must have at least one dimension, got {}", op, x.describe());
  KILN_CHECK(bias.dim() == 1 && bias.size(0) == x.size(-1), "{}: bias must be [{}] to match x {}, got {}", op,
             x.size(-1), x.describe(), bias.describe());
  KILN_CHECK(bias.dtype() == x.dtype(), "{}: bias {} and x {} differ in dtype", op, bias.describe(), x.describe());
  Args a;
  a.x = x.contiguous();
  a.bias = bias.contiguous();
  a.cols = x.size(-1);
  a.rows = a.cols == 0 ? 0 : x.numel() / a.cols;
  return a;
}

// ---- CPU kernels

constexpr double kSqrtHalf = 0.70710678118654752440;    // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)

template <class T>
T gelu(T v) {
  return T(0.5) * v * (T(1) + std::erf(v * T(kSqrtHalf)));
}

template <class T>
T gelu_grad(T v) {  // d/dv gelu(v) = Phi(v) + v * phi(v)
  const T cdf = T(0.5) * (T(1) + std::erf(v * T(kSqrtHalf)));
  const T pdf = std::exp(T(-0.5) * v * v) * T(kInvSqrt2Pi);
  return cdf + v * pdf;
}

template <class T>
void forward_cpu(const T* x, const T* b, T* y, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) y[r * cols + c] = gelu(x[r * cols + c] + b[c]);
}

template <class T>
void backward_cpu(const T* gy, const T* x, const T* b, T* gx, T* gb, std::int64_t rows, std::int64_t cols) {
  std::vector<double> sums(static_cast<std::size_t>(cols), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t i = r * cols + c;
      gx[i] = gy[i] * gelu_grad(x[i] + b[c]);
      sums[static_cast<std::size_t>(c)] += static_cast<double>(gx[i]);
    }
  for (std::int64_t c = 0; c < cols; ++c) gb[c] = static_cast<T>(sums[static_cast<std::size_t>(c)]);
}

std::vector<Tensor> forward_kernel_cpu(const std::vector<Tensor>& in, const Attrs&) {
  Args a = check_args("bias_gelu", in[0], in[1]);
  Tensor y = Tensor::empty(a.x.shape(), a.x.dtype(), a.x.device());
  if (a.x.dtype() == DType::F32)
    forward_cpu(a.x.data<float>(), a.bias.data<float>(), y.data<float>(), a.rows, a.cols);
  else
    forward_cpu(a.x.data<double>(), a.bias.data<double>(), y.data<double>(), a.rows, a.cols);
  return {y};
}

std::vector<Tensor> backward_kernel_cpu(const std::vector<Tensor>& in, const Attrs&) {
  Args a = check_args("bias_gelu_backward", in[1], in[2]);
  Tensor gy = in[0].contiguous();
  KILN_CHECK(gy.shape() == a.x.shape() && gy.dtype() == a.x.dtype(), "bias_gelu_backward: grad {} does not match x {}",
             gy.describe(), a.x.describe());
  Tensor gx = Tensor::empty(a.x.shape(), a.x.dtype(), a.x.device());
  Tensor gb = Tensor::empty(a.bias.shape(), a.x.dtype(), a.x.device());
  if (a.x.dtype() == DType::F32)
    backward_cpu(gy.data<float>(), a.x.data<float>(), a.bias.data<float>(), gx.data<float>(), gb.data<float>(), a.rows,
                 a.cols);
  else
    backward_cpu(gy.data<double>(), a.x.data<double>(), a.bias.data<double>(), gx.data<double>(), gb.data<double>(),
                 a.rows, a.cols);
  return {gx, gb};
}

// ---- CUDA kernels: thin wrappers around the launchers in op_kernel.cu

#if BIAS_GELU_WITH_CUDA
cuda::Type cuda_type(const Tensor& t) { return t.dtype() == DType::F32 ? cuda::Type::F32 : cuda::Type::F64; }

void* stream_of(const Tensor& t) { return kiln::backend_for(t.device()).current_stream(t.device().index).handle; }

std::vector<Tensor> forward_kernel_cuda(const std::vector<Tensor>& in, const Attrs&) {
  Args a = check_args("bias_gelu", in[0], in[1]);
  Tensor y = Tensor::empty(a.x.shape(), a.x.dtype(), a.x.device());
  const char* err = cuda::forward(cuda_type(a.x), a.x.data_ptr(), a.bias.data_ptr(), y.data_ptr(), a.rows, a.cols,
                                  a.x.device().index, stream_of(a.x));
  KILN_CHECK(err == nullptr, "bias_gelu: CUDA kernel failed on {}: {}", a.x.device().str(), err);
  return {y};
}

std::vector<Tensor> backward_kernel_cuda(const std::vector<Tensor>& in, const Attrs&) {
  Args a = check_args("bias_gelu_backward", in[1], in[2]);
  Tensor gy = in[0].contiguous();
  KILN_CHECK(gy.shape() == a.x.shape() && gy.dtype() == a.x.dtype(), "bias_gelu_backward: grad {} does not match x {}",
             gy.describe(), a.x.describe());
  Tensor gx = Tensor::empty(a.x.shape(), a.x.dtype(), a.x.device());
  Tensor gb = Tensor::empty(a.bias.shape(), a.x.dtype(), a.x.device());
  const char* err = cuda::backward(cuda_type(a.x), gy.data_ptr(), a.x.data_ptr(), a.bias.data_ptr(), gx.data_ptr(),
                                   gb.data_ptr(), a.rows, a.cols, a.x.device().index, stream_of(a.x));
  KILN_CHECK(err == nullptr, "bias_gelu_backward: CUDA kernel failed on {}: {}", a.x.device().str(), err);
  return {gx, gb};
}
#endif

// The backward of bias_gelu is itself an op, so it runs on whichever device the tensors are on.
std::vector<Tensor> bias_gelu_backward(const kiln::BackwardContext& ctx) {
  std::vector<Tensor> g = kiln::call_op("bias_gelu_backward", {ctx.grad_outputs[0], ctx.inputs[0], ctx.inputs[1]});
  return {g[0], g[1]};
}

}  // namespace

void register_ops(kiln::OpRegistry& registry) {
  registry.def({.name = "bias_gelu",
                .num_inputs = 2,
                .num_outputs = 1,
                .backward = bias_gelu_backward,
                .save_inputs = true,
                .save_outputs = false,
                .doc = "y = gelu(x + bias), fused; x [..., C], bias [C]"});
  registry.def({.name = "bias_gelu_backward",
                .num_inputs = 3,
                .num_outputs = 2,
                .doc = "(grad_y, x, bias) -> (grad_x, grad_bias) of bias_gelu"});
  registry.impl("bias_gelu", DeviceKind::CPU, {DType::F32, DType::F64}, forward_kernel_cpu);
  registry.impl("bias_gelu_backward", DeviceKind::CPU, {DType::F32, DType::F64}, backward_kernel_cpu);
#if BIAS_GELU_WITH_CUDA
  registry.impl("bias_gelu", DeviceKind::CUDA, {DType::F32, DType::F64}, forward_kernel_cuda);
  registry.impl("bias_gelu_backward", DeviceKind::CUDA, {DType::F32, DType::F64}, backward_kernel_cuda);
#endif
}

Tensor bias_gelu(const Tensor& x, const Tensor& bias) {
  static const kiln::TypedOp<2> op("bias_gelu");
  return op(x, bias);
}

}  // namespace bias_gelu

// The entry point kiln::load_extension() looks for.
extern "C" KILN_EXTENSION_EXPORT void kiln_extension_init(kiln::OpRegistry& registry) {
  bias_gelu::register_ops(registry);
}
