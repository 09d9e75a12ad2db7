// load_safetensors on arbitrary bytes: it loads, or refuses with a kiln::Error naming the file.
// What it loads is saved and loaded again and must come back the same (names, dtypes, shapes,
// bytes, metadata).
#include <cstring>

#include "fuzz_support.h"
#include "kiln/io/safetensors.h"

namespace {

void check_same(const kiln::io::SafetensorsFile& a, const kiln::io::SafetensorsFile& b) {
  if (a.metadata != b.metadata) kiln::fuzz::fail("the metadata changed on a save/load round trip");
  if (a.tensors.size() != b.tensors.size()) kiln::fuzz::fail("the tensor count changed on a save/load round trip");
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& [name, t] = a.tensors[i];
    const auto& [name_b, u] = b.tensors[i];
    if (name != name_b || t.dtype() != u.dtype() || t.shape() != u.shape() || t.nbytes() != u.nbytes() ||
        (t.nbytes() > 0 && std::memcmp(t.data_ptr(), u.data_ptr(), t.nbytes()) != 0))
      kiln::fuzz::fail("tensor '" + name + "' changed on a save/load round trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = kiln::fuzz::scratch_path("model.safetensors").string();
  static const std::string copy = kiln::fuzz::scratch_path("copy.safetensors").string();
  kiln::fuzz::write_file(path, {data, size});
  kiln::io::SafetensorsFile file;
  if (!kiln::fuzz::parses(path, [&] { file = kiln::io::load_safetensors(path); })) return 0;
  kiln::io::save_safetensors(copy, file.tensors, file.metadata);
  check_same(file, kiln::io::load_safetensors(copy));
  return 0;
}
