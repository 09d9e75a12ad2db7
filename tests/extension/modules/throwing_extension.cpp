// A test extension whose init registers one op, then fails: nothing of it may stay registered.
#include "kiln/extension/extension.h"

extern "C" KILN_EXTENSION_EXPORT void kiln_extension_init(kiln::OpRegistry& registry) {
  registry.def({.name = "half_registered"});
  registry.impl("half_registered", kiln::DeviceKind::CPU, kiln::DType::F32,
                [](const std::vector<kiln::Tensor>& in, const kiln::Attrs&) { return in; });
  KILN_FAIL("throwing_extension: the GPU it wants is missing");
}
