// A test extension: "ext_scale" (y = x * attr "scale", default 2) on the CPU, with its backward.
#include "kiln/extension/extension.h"
#include "kiln/ops/elementwise.h"

namespace {

std::vector<kiln::Tensor> scale(const std::vector<kiln::Tensor>& in, const kiln::Attrs& attrs) {
  return {kiln::ops::binary(kiln::ops::BinaryOp::Mul, in[0], attrs.get<double>("scale", 2.0))};
}

}  // namespace

extern "C" KILN_EXTENSION_EXPORT void kiln_extension_init(kiln::OpRegistry& registry) {
  registry.def({.name = "ext_scale",
                .num_inputs = 1,
                .num_outputs = 1,
                .backward = [](const kiln::BackwardContext& ctx) -> std::vector<kiln::Tensor> {
                  return {kiln::call_op("ext_scale", {ctx.grad_outputs[0]}, ctx.attrs)[0]};
                }});
  registry.impl("ext_scale", kiln::DeviceKind::CPU, {kiln::DType::F32, kiln::DType::F64}, scale);
}
