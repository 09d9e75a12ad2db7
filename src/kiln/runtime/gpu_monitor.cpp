#include "kiln/runtime/gpu_monitor.h"

#include <dlfcn.h>

#include <mutex>

namespace kiln {

namespace {

// The few NVML entry points used, declared by hand (nvml.h would tie the build to the toolkit).
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
using NvmlDevice = void*;
using InitFn = int (*)();
using HandleFn = int (*)(unsigned int, NvmlDevice*);
using UtilFn = int (*)(NvmlDevice, NvmlUtilization*);

struct Nvml {
  HandleFn handle = nullptr;
  UtilFn utilization = nullptr;
  bool ok = false;
};

const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!lib) return;
    auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
    n.handle = reinterpret_cast<HandleFn>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    n.utilization = reinterpret_cast<UtilFn>(dlsym(lib, "nvmlDeviceGetUtilizationRates"));
    n.ok = init && n.handle && n.utilization && init() == 0;
  });
  return n;
}

}  // namespace

std::optional<int> gpu_utilisation(int index) {
  const Nvml& n = nvml();
  if (!n.ok) return std::nullopt;
  NvmlDevice dev = nullptr;
  NvmlUtilization u{};
  if (n.handle(static_cast<unsigned int>(index), &dev) != 0 || n.utilization(dev, &u) != 0) return std::nullopt;
  return static_cast<int>(u.gpu);
}

}  // namespace kiln
