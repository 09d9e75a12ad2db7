#pragma once
// What an extension's sources include: the op registry, attributes and tensors, plus the entry
// point Kiln looks for when it loads the library (see docs/extensions.md):
//
//   extern "C" KILN_EXTENSION_EXPORT void kiln_extension_init(kiln::OpRegistry& registry) {
//     my_ops::register_ops(registry);
//   }
#include "kiln/extension/attrs.h"
#include "kiln/extension/op_registry.h"
#include "kiln/tensor/tensor.h"

// Keeps the entry point visible when an extension is built with -fvisibility=hidden.
#define KILN_EXTENSION_EXPORT __attribute__((visibility("default")))

// The name and type of the entry point load_extension() calls.
#define KILN_EXTENSION_INIT_SYMBOL "kiln_extension_init"
namespace kiln {
using ExtensionInitFn = void (*)(OpRegistry& registry);
}
