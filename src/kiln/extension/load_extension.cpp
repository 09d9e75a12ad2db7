#include "kiln/extension/load_extension.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>

#include "kiln/extension/extension.h"

namespace kiln {

namespace {

struct Loaded {
  void* handle;
  std::uint64_t registry;  // OpRegistry::id(), not its address, which a later registry may reuse
  LoadedExtension info;
};

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

}  // namespace

LoadedExtension load_extension(const std::string& path, OpRegistry& registry) {
  static std::mutex mutex;
  static std::vector<Loaded> loaded;
  std::lock_guard lock(mutex);

  KILN_CHECK(!path.empty(), "load_extension: empty path");
  if (path.find('/') != std::string::npos && !std::filesystem::exists(path))
    KILN_FAIL("load_extension('{}'): no such file (current directory {})", path,
              std::filesystem::current_path().string());
  // dlopen() looks a bare name up in the library path only; a file of that name here wins.
  const std::string target = path.find('/') == std::string::npos && std::filesystem::exists(path) ? "./" + path : path;
  dlerror();
  void* handle = dlopen(target.c_str(), RTLD_NOW | RTLD_LOCAL);
  KILN_CHECK(handle, "load_extension('{}'): cannot load the library: {}", path, dl_error());
  for (const auto& l : loaded) {
    if (l.handle == handle && l.registry == registry.id()) {
      dlclose(handle);  // drop the extra reference this dlopen took
      return l.info;
    }
  }

  dlerror();
  auto init = reinterpret_cast<ExtensionInitFn>(dlsym(handle, KILN_EXTENSION_INIT_SYMBOL));
  if (!init) {
    std::string why = dl_error();
    dlclose(handle);
    KILN_FAIL(
        "load_extension('{}'): the library has no kiln_extension_init: define "
        "extern \"C\" KILN_EXTENSION_EXPORT void kiln_extension_init(kiln::OpRegistry&) in it "
        "(kiln/extension/extension.h) ({})",
        path, why);
  }

  // Kernels registered by the init live in the library's code: the staging registry must be
  // destroyed before the library is unloaded on an error.
  LoadedExtension info{path, {}};
  std::string error;
  {
    OpRegistry staged;
    try {
      init(staged);
      try {
        info.ops = registry.merge(std::move(staged));
      } catch (const std::exception& e) {
        error = e.what();  // nothing of this library was registered, so it can be unloaded again
      }
    } catch (const std::exception& e) {
      error = fmt::format("kiln_extension_init failed: {}", e.what());
    }
  }
  if (!error.empty()) {
    dlclose(handle);
    KILN_FAIL("load_extension('{}'): {}", path, error);
  }
  loaded.push_back({handle, registry.id(), info});
  return info;
}

}  // namespace kiln
