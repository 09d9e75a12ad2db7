#pragma once
// Loading a custom-op extension (a shared library built with kiln_add_extension) at run time.
#include <string>
#include <vector>

#include "kiln/extension/op_registry.h"

namespace kiln {

struct LoadedExtension {
  std::string path;
  std::vector<std::string> ops;  // the ops it declared or added kernels to
};

// dlopen()s `path` (a bare file name: the file in the current directory if there is one, else
// the library search path) and calls its `extern "C" void kiln_extension_init(kiln::OpRegistry&)` on a
// fresh registry, then merges that into `registry` (all or nothing: see OpRegistry::merge).
// Loading the same library again returns the first result without calling the init again.
// Errors (the file cannot be loaded, has no kiln_extension_init, the init throws, an op or
// kernel is already registered) raise kiln::Error naming the path and the cause. The library
// stays loaded until the process exits: its kernels may be referenced by autograd graphs.
LoadedExtension load_extension(const std::string& path, OpRegistry& registry = op_registry());

}  // namespace kiln
