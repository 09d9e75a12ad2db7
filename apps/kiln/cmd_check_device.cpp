// `kiln check-device`: what a vendor's check script reports: version, build options, every device
// with its name, memory and compute capability, a tensor test on each, and a CPU-vs-GPU matmul.
#include <fmt/format.h>

#include "commands.h"
#include "kiln/build_info.h"
#include "kiln/runtime/backend.h"

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
  return 0;
}

}  // namespace

void add_check_device(CLI::App& app) {
  auto* cmd = app.add_subcommand("check-device", "Report Kiln's build and every device, and test each one");
  cmd->callback([] {
    if (int rc = run_check_device(); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kiln::cli
