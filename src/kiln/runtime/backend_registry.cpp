#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"

namespace kiln {

std::unique_ptr<Backend> make_cpu_backend();
#if KILN_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend();
#endif

void BackendRegistry::add(std::unique_ptr<Backend> backend) {
  auto slot = static_cast<int>(backend->kind());
  KILN_CHECK(!backends_[slot], "backend '{}' registered twice", device_kind_name(backend->kind()));
  backends_[slot] = std::move(backend);
}

bool BackendRegistry::has(DeviceKind kind) const { return backends_[static_cast<int>(kind)] != nullptr; }

Backend& BackendRegistry::get(DeviceKind kind) const {
  auto& b = backends_[static_cast<int>(kind)];
  KILN_CHECK(b, "device kind '{}' is not available in this build of Kiln (built with CUDA: {})", device_kind_name(kind),
             KILN_WITH_CUDA ? "yes" : "no");
  return *b;
}

static void register_builtin_backends(BackendRegistry& registry) {
  registry.add(make_cpu_backend());
#if KILN_WITH_CUDA
  registry.add(make_cuda_backend());
#endif
}

BackendRegistry& backends() {
  // Every allocation and free asks for the registry: a function-local static costs one inline
  // guard load, where std::call_once calls into libstdc++ and pthread_once each time.
  static BackendRegistry& registry = []() -> BackendRegistry& {
    static BackendRegistry r;
    register_builtin_backends(r);
    return r;
  }();
  return registry;
}

Backend& backend_for(Device device) {
  Backend& b = backends().get(device.kind);
  KILN_CHECK(device.index >= 0 && device.index < b.device_count(), "device {} does not exist: {} {} device(s) found",
             device.str(), b.device_count(), device_kind_name(device.kind));
  return b;
}

int device_count(DeviceKind kind) {
  auto& reg = backends();
  return reg.has(kind) ? reg.get(kind).device_count() : 0;
}

void synchronize(Device device) { backend_for(device).synchronize(device.index); }

}  // namespace kiln
