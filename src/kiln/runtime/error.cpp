#include "kiln/runtime/error.h"

#include <array>
#include <cstring>
#include <string_view>
#include <utility>

#include "kiln/runtime/located_error.h"

namespace kiln {

namespace {
std::string with_location(const std::string& message, const char* file, int line) {
  return fmt::format("{} ({}:{})", message, short_source_path(file), line);
}
}  // namespace

LocatedError::LocatedError(const std::string& message, const char* file, int line)
    : Error(with_location(message, file, line)), SourceLocated(message, short_source_path(file), line) {}

LocatedOutOfMemoryError::LocatedOutOfMemoryError(const std::string& message, const char* file, int line)
    : OutOfMemoryError(with_location(message, file, line)), SourceLocated(message, short_source_path(file), line) {}

const char* short_source_path(const char* file) {
  // The library's sources keep the path below src/ ("kiln/..."), as messages always showed them;
  // the rest keep it from their top-level folder. The last match wins, so a checkout that itself
  // lives under a folder named src/ or apps/ still shortens to the repository's own path.
  constexpr std::array<std::pair<std::string_view, std::size_t>, 5> kRoots{
      {{"src/kiln/", 4}, {"apps/", 0}, {"tests/", 0}, {"bench/", 0}, {"examples/", 0}}};
  const char* best = nullptr;
  for (const auto& [root, skip] : kRoots) {
    for (const char* at = std::strstr(file, root.data()); at != nullptr; at = std::strstr(at + 1, root.data())) {
      bool starts_component = at == file || at[-1] == '/';
      if (starts_component && (best == nullptr || at + skip > best)) best = at + skip;
    }
  }
  return best ? best : file;
}

std::string error_message(const std::exception& e, bool with_location) {
  if (!with_location)
    if (const auto* located = dynamic_cast<const SourceLocated*>(&e)) return located->message();
  return e.what();
}

namespace detail {

void throw_error(const std::string& message, const char* file, int line) { throw LocatedError(message, file, line); }

}  // namespace detail

}  // namespace kiln
