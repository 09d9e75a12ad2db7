#include "kiln/runtime/error.h"

#include <cstring>

namespace kiln::detail {

void throw_error(const std::string& message, const char* file, int line) {
  // Keep only the path below src/ so messages are stable across checkouts.
  const char* shown = std::strstr(file, "src/kiln/");
  throw Error(fmt::format("{} ({}:{})", message, shown ? shown + 4 : file, line));
}

}  // namespace kiln::detail
