// `kiln check-device`: what a vendor's check script reports: version, build options, every device
// with its name, memory and compute capability, a tensor test on each, and a CPU-vs-GPU matmul.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "commands.h"
#include "kiln/autograd/functions.h"
#include "kiln/build_info.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/event.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::cli {

namespace {

void print_build() {
  fmt::print("Kiln {}\n", build_info::version);
  fmt::print("  build type:        {}\n", build_info::build_type);
  fmt::print("  C++ compiler:      {}\n", build_info::cxx_compiler);
  fmt::print("  CUDA backend:      {}\n",
             build_info::cuda
                 ? fmt::format("yes (nvcc {}, sm_{})", build_info::cuda_compiler, build_info::cuda_architectures)
                 : std::string("no"));
  fmt::print("  sanitizers:        {}\n", build_info::sanitizers ? "ASan+UBSan" : "off");
}

void print_device(Device device) {
  auto props = backend_for(device).properties(device.index);
  fmt::print("{}: {}\n", device.str(), props.name);
  fmt::print("  memory:            {:.1f} GiB total, {:.1f} GiB free\n", props.total_memory / 1073741824.0,
             props.free_memory / 1073741824.0);
  if (device.is_cuda()) {
    fmt::print("  compute capability {}.{}, {} SMs\n", props.compute_major, props.compute_minor, props.multiprocessors);
  } else {
    fmt::print("  hardware threads:  {}\n", props.multiprocessors);
  }
}

// A small end-to-end test of a device: factories, elementwise, reduction, matmul and a backward
// pass, compared with the same computation on the CPU. Returns an error text, or "" when it passes.
std::string tensor_test(Device device) {
  try {
    Tensor a = Tensor::randn({64, 32}, 1).to(device);
    Tensor b = Tensor::randn({32, 16}, 2).to(device).requires_grad_();
    Tensor loss = sum(relu(matmul(a, b)) * 0.5);
    loss.backward();
    Tensor ca = Tensor::randn({64, 32}, 1);
    Tensor cb = Tensor::randn({32, 16}, 2).requires_grad_();
    Tensor closs = sum(relu(matmul(ca, cb)) * 0.5);
    closs.backward();
    double diff = std::abs(loss.item() - closs.item()) / std::max(1.0, std::abs(closs.item()));
    auto g = b.grad().to_vector<float>();
    auto cg = cb.grad().to_vector<float>();
    double gdiff = 0;
    for (std::size_t i = 0; i < g.size(); ++i) gdiff = std::max(gdiff, static_cast<double>(std::abs(g[i] - cg[i])));
    if (diff > 1e-3 || gdiff > 1e-2) return fmt::format("results differ from the CPU (loss {:.3g}, grad {:.3g})", diff, gdiff);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// Median milliseconds of an n x n x n float32 matmul on a device, timed with events after warm-up.
double time_matmul(Device device, std::int64_t n, int reps) {
  NoGradGuard no_grad;
  Tensor a = Tensor::randn({n, n}, 3, DType::F32, device);
  Tensor b = Tensor::randn({n, n}, 4, DType::F32, device);
  for (int i = 0; i < 2; ++i) matmul(a, b);
  synchronize(device);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    Event start(device), stop(device);
    start.record();
    Tensor c = matmul(a, b);
    stop.record();
    ms.push_back(stop.elapsed_ms(start));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int run_check_device() {
  print_build();
  fmt::print("\nDevices\n");
  print_device(Device::cpu());
  int gpus = device_count(DeviceKind::CUDA);
  if (gpus == 0) {
    fmt::print("no CUDA GPU found{}: running on the CPU only\n",
               build_info::cuda ? "" : " (this build has no CUDA backend)");
  }
  for (int i = 0; i < gpus; ++i) print_device(Device::cuda(i));

  fmt::print("\nTensor test (randn, matmul, relu, sum, backward; compared with the CPU)\n");
  int failures = 0;
  std::vector<Device> devices{Device::cpu()};
  for (int i = 0; i < gpus; ++i) devices.push_back(Device::cuda(i));
  for (Device d : devices) {
    std::string err = tensor_test(d);
    fmt::print("  {:<8} {}\n", d.str(), err.empty() ? "PASSED" : "FAILED: " + err);
    failures += !err.empty();
  }

  const std::int64_t n = 1024;
  double flops = 2.0 * n * n * n;
  fmt::print("\nMatmul {}x{}x{} float32 (median of timed runs)\n", n, n, n);
  double cpu_ms = time_matmul(Device::cpu(), n, 5);
  fmt::print("  cpu      {:8.3f} ms  {:8.1f} GFLOP/s\n", cpu_ms, flops / cpu_ms / 1e6);
  for (int i = 0; i < gpus && failures == 0; ++i) {
    double gpu_ms = time_matmul(Device::cuda(i), n, 20);
    fmt::print("  cuda:{}   {:8.3f} ms  {:8.1f} GFLOP/s  speedup {:.1f}x over the CPU\n", i, gpu_ms,
               flops / gpu_ms / 1e6, cpu_ms / gpu_ms);
  }
  fmt::print("\n{}\n", failures ? "check-device: FAILED" : "check-device: all devices passed");
  return failures ? 1 : 0;
}

}  // namespace

void add_check_device(CLI::App& app) {
  auto* cmd = app.add_subcommand("check-device", "Report Kiln's build and every device, and test each one");
  cmd->callback([] {
    if (int rc = run_check_device(); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kiln::cli
