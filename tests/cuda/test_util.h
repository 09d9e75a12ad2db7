#pragma once
// Helpers of the CUDA kernel tests: every CUDA kernel is run against the CPU kernel of the same
// table entry on the same random inputs, into outputs poisoned with NaN (or a sentinel for
// integers), and compared with a tolerance per dtype. Tests skip when no GPU is present, and
// (for entries the CPU table does not fill yet) when there is no CPU reference.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kiln/ops/copy.h"
#include "kiln/ops/kernels.h"
#include "kiln/runtime/backend.h"
#include "kiln/tensor/tensor.h"

namespace kiln::cudatest {

inline Device gpu() { return Device::cuda(0); }
// A built-in op's kernel on each side: cpu_kernel(ops::op::unary)(op, in, out, 0).
template <class Sig>
typename ops::KernelOp<Sig>::Fn cpu_kernel(ops::KernelOp<Sig> op) {
  return ops::kernel(op, Device::cpu());
}
template <class Sig>
typename ops::KernelOp<Sig>::Fn cuda_kernel(ops::KernelOp<Sig> op) {
  return ops::kernel(op, gpu());
}
template <class Sig>
bool has_cpu_kernel(ops::KernelOp<Sig> op) {
  return ops::kernel_registry().find_kernel(op.id, DeviceKind::CPU) != nullptr;
}

#define KILN_REQUIRE_CUDA()                                                                 \
  do {                                                                                      \
    if (::kiln::device_count(::kiln::DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA GPU"; \
  } while (0)

#define KILN_REQUIRE_CPU_REF(name)                                                                               \
  do {                                                                                                           \
    if (!::kiln::cudatest::has_cpu_kernel(::kiln::ops::op::name)) GTEST_SKIP() << "no CPU reference for " #name; \
  } while (0)

// Random values (normal, scaled and shifted), made on the CPU in f64 and converted.
inline Tensor randn(Shape shape, std::uint64_t seed, DType dtype, double scale = 1.0, double shift = 0.0) {
  Tensor t = Tensor::randn(std::move(shape), seed, DType::F64);
  if (scale != 1.0 || shift != 0.0) {
    Tensor u = Tensor::empty(t.shape(), DType::F64);
    cpu_kernel(ops::op::binary_scalar)(ops::BinaryOp::Mul, t, scale, u);
    cpu_kernel(ops::op::binary_scalar)(ops::BinaryOp::Add, u, shift, t);
  }
  return ops::to(t, Device::cpu(), dtype);
}

inline Tensor rand_int(Shape shape, std::uint64_t seed, std::int64_t lo, std::int64_t hi) {
  Tensor u = Tensor::rand(std::move(shape), seed, DType::F64);
  auto v = u.to_vector<double>();
  std::vector<std::int64_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    out[i] = lo + static_cast<std::int64_t>(std::floor(v[i] * static_cast<double>(hi - lo)));
  return Tensor::from_vector(out, u.shape());
}

// An output tensor filled with NaN (floating) or a sentinel (integers), so unwritten elements show.
inline Tensor poisoned(const Shape& shape, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  if (t.numel() == 0) return t;
  double v = is_floating(dtype) ? std::numeric_limits<double>::quiet_NaN() : (dtype == DType::Bool ? 1.0 : 77.0);
  ops::fill(t, v);
  return t;
}

inline Tensor on(const Tensor& t, Device d) { return t.defined() ? ops::to(t, d, t.dtype()) : Tensor(); }

inline double default_tol(DType t) {
  switch (t) {
    case DType::F64: return 1e-9;
    case DType::F32: return 2e-5;
    case DType::BF16: return 2e-2;
    case DType::F16: return 4e-3;
    default: return 0;
  }
}

// |a - b| <= atol + rtol * |b| elementwise (NaN must match NaN).
inline void expect_close(const Tensor& got, const Tensor& want, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  auto g = got.to_vector<double>();
  auto w = want.to_vector<double>();
  int bad = 0;
  double worst = 0;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    bool ok;
    if (std::isnan(w[i]))
      ok = std::isnan(g[i]);
    else if (std::isinf(w[i]))
      ok = g[i] == w[i];
    else
      ok = std::fabs(g[i] - w[i]) <= atol + rtol * std::fabs(w[i]);
    if (!ok) {
      double err = std::isnan(g[i]) ? INFINITY : std::fabs(g[i] - w[i]);
      if (bad == 0 || err > worst) {
        worst = err;
        worst_i = i;
      }
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << g.size() << " elements differ; worst at " << worst_i << ": got "
                    << (g.empty() ? 0 : g[worst_i]) << " want " << (w.empty() ? 0 : w[worst_i]);
}

inline void expect_close(const Tensor& got, const Tensor& want, const std::string& what, double scale = 1.0) {
  double tol = default_tol(want.dtype()) * scale;
  expect_close(got, want, tol, tol, what);
}

inline std::string name(DType t) { return std::string(dtype_name(t)); }

}  // namespace kiln::cudatest
