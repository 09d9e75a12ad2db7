#pragma once
// bias_gelu: y = gelu(x + bias), fused, with the exact (erf) GELU. x [..., C], bias [C].
// Registered as the custom op "bias_gelu" (backward: "bias_gelu_backward").
#include <kiln/extension/extension.h>

namespace bias_gelu {

// Declares the ops and registers their CPU (and, when built, CUDA) kernels. kiln_extension_init
// calls this for kiln::load_extension(); a program that links the library can call it itself.
void register_ops(kiln::OpRegistry& registry);

// Calls the op in kiln::op_registry() (after register_ops(kiln::op_registry()) or load_extension).
kiln::Tensor bias_gelu(const kiln::Tensor& x, const kiln::Tensor& bias);

}  // namespace bias_gelu
