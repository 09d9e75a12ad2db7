// Checks the fused bias_gelu op against Kiln's built-in ops (kiln::add + kiln::gelu): forward,
// gradients, a finite-difference gradient check, and the errors a user can cause. On a machine
// with a CUDA device (and the CUDA kernel built) it checks the GPU kernels against the CPU.
//   test_bias_gelu                    the extension is linked; registers through register_ops()
//   test_bias_gelu_dlopen <library>   loads the library with kiln::load_extension()
#include <kiln/autograd/functions.h>
#include <kiln/autograd/gradcheck.h>
#include <kiln/extension/load_extension.h>
#include <kiln/runtime/backend.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#if !TEST_LOAD_AT_RUN_TIME
#include "op.h"
#endif

namespace {

using kiln::Device;
using kiln::DeviceKind;
using kiln::DType;
using kiln::Tensor;

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "[ ok ]" : "[FAIL]", what.c_str());
  if (!ok) ++failures;
}

// A contiguous tensor's bytes copied to the host through the backend: needs no copy kernel on
// the device, so the GPU checks depend on this extension's kernels only.
Tensor to_host(const Tensor& t) {
  if (t.device().is_cpu()) return t;
  Tensor c = t.contiguous();
  Tensor host = Tensor::empty(c.shape(), c.dtype());
  kiln::backend_for(c.device()).copy_to_host(host.data_ptr(), c.data_ptr(), c.nbytes(), c.device().index);
  return host;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return INFINITY;
  auto va = to_host(a).to_vector<double>(), vb = to_host(b).to_vector<double>();
  if (va.size() != vb.size()) return INFINITY;
  double m = 0;
  for (std::size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

// Expects `f` to throw kiln::Error whose message contains every one of `parts`.
template <class F>
void check_error(F&& f, std::initializer_list<const char*> parts, const std::string& what) {
  try {
    f();
    check(false, what + ": no error raised");
  } catch (const kiln::Error& e) {
    std::string msg = e.what();
    bool ok = std::all_of(parts.begin(), parts.end(), [&](const char* p) { return msg.find(p) != std::string::npos; });
    check(ok, what + ": " + msg);
  }
}

Tensor fused(const Tensor& x, const Tensor& b) { return kiln::call_op("bias_gelu", {x, b})[0]; }
Tensor unfused(const Tensor& x, const Tensor& b) { return kiln::gelu(kiln::add(x, b)); }

// Forward and gradients of the fused op on `device` against the built-ins on the CPU.
void compare_with_builtins(Device device, DType dtype, double tol) {
  const std::string tag = std::string(kiln::dtype_name(dtype)) + " on " + device.str();
  Tensor x0 = Tensor::randn({4, 33, 40}, 1, dtype), b0 = Tensor::randn({40}, 2, dtype);
  Tensor gy = Tensor::randn({4, 33, 40}, 3, dtype);

  Tensor x = x0.to(device).detach().requires_grad_(), b = b0.to(device).detach().requires_grad_();
  Tensor y = fused(x, b);
  y.backward(gy.to(device));

  Tensor xr = x0.detach().requires_grad_(), br = b0.detach().requires_grad_();
  Tensor yr = unfused(xr, br);
  yr.backward(gy);

  check(y.device() == device && y.shape() == x0.shape(), "bias_gelu output is " + y.describe());
  check(max_abs_diff(y, yr) < tol, "forward matches gelu(add(x, b)), " + tag);
  check(max_abs_diff(x.grad(), xr.grad()) < tol, "grad x matches the built-ins, " + tag);
  check(max_abs_diff(b.grad(), br.grad()) < tol * 40, "grad bias matches the built-ins, " + tag);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // keep the log up to a crash
  try {
#if TEST_LOAD_AT_RUN_TIME
    if (argc < 2) {
      std::fprintf(stderr, "usage: %s <path to the bias_gelu extension library>\n", argv[0]);
      return 2;
    }
    kiln::LoadedExtension ext = kiln::load_extension(argv[1]);
    check(ext.ops.size() == 2, "load_extension registered " + std::to_string(ext.ops.size()) + " ops");
    check(kiln::load_extension(argv[1]).ops == ext.ops, "loading the same extension twice is a no-op");
#else
    (void)argc;
    (void)argv;
    bias_gelu::register_ops(kiln::op_registry());
    check(bias_gelu::bias_gelu(Tensor::ones({2, 3}), Tensor::zeros({3})).shape() == kiln::Shape({2, 3}),
          "the typed handle bias_gelu::bias_gelu() works");
#endif
    std::printf("%s\n", kiln::op_registry().describe("bias_gelu").c_str());

    compare_with_builtins(Device::cpu(), DType::F32, 1e-5);
    compare_with_builtins(Device::cpu(), DType::F64, 1e-12);

    auto result = kiln::autograd::gradcheck(
        [](const std::vector<Tensor>& in) { return fused(in[0], in[1]); },
        {Tensor::randn({5, 7}, 4, DType::F64).requires_grad_(), Tensor::randn({7}, 5, DType::F64).requires_grad_()});
    check(result.ok, "gradcheck of bias_gelu (float64) " + result.message);

    // Errors a user can cause.
    check_error(
        [] {
          kiln::op_registry().impl("bias_gelu", DeviceKind::CPU, DType::F32,
                                   [](const auto&, const auto&) { return std::vector<Tensor>{}; });
        },
        {"bias_gelu", "cpu", "already registered"}, "registering a kernel twice is an error");
    check_error(
        [] {
          fused(Tensor::ones({2, 3}, DType::F16), Tensor::ones({3}, DType::F16));
        },
        {"bias_gelu", "cpu", "float16"}, "a dtype without a kernel is an error");
    check_error(
        [] {
          fused(Tensor::ones({2, 3}), Tensor::ones({4}));
        },
        {"bias_gelu", "bias must be [3]"}, "a bias of the wrong size is an error");

    const bool has_cuda_kernel = kiln::op_registry().has_kernel("bias_gelu", DeviceKind::CUDA, DType::F32);
    if (has_cuda_kernel && kiln::device_count(DeviceKind::CUDA) > 0) {
      compare_with_builtins(Device::cuda(0), DType::F32, 1e-5);
      compare_with_builtins(Device::cuda(0), DType::F64, 1e-12);
      Tensor big = Tensor::randn({1024, 4096}, 6, DType::F32), bias = Tensor::randn({4096}, 7, DType::F32);
      check(max_abs_diff(fused(big.to(Device::cuda(0)), bias.to(Device::cuda(0))), fused(big, bias)) < 1e-5,
            "CUDA forward (vectorised path) matches the CPU kernel at 1024x4096");
    } else {
      std::printf("[skip] GPU checks: %s\n", has_cuda_kernel ? "the CUDA kernel is built but no CUDA device is present"
                                                             : "the CUDA kernel is not built");
    }
  } catch (const std::exception& e) {
    std::printf("[FAIL] unexpected error: %s\n", e.what());
    return 1;
  }
  if (failures == 0)
    std::printf("all bias_gelu checks passed\n");
  else
    std::printf("%d bias_gelu checks FAILED\n", failures);
  return failures == 0 ? 0 : 1;
}
