#pragma once
// What every harness needs: a scratch folder for the files a parser is handed (the parsers read
// paths, as users give them), and the rule every parser must keep on bad input:
//   it throws kiln::Error, and the message names the file it was reading.
// Any other exception (nlohmann's type errors, std::out_of_range from map::at, std::bad_alloc) or
// a kiln::Error that does not name the file is reported as a failure, like a sanitizer finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>

#include "kiln/runtime/error.h"

namespace kiln::fuzz {

// One folder per process (libFuzzer's -fork and -jobs run several), removed at exit.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("kiln fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return std::filesystem::path(pattern);
  }();
  return dir;
}

inline std::filesystem::path scratch_path(std::string_view name) { return scratch_dir() / name; }

inline void write_file(const std::filesystem::path& path, std::span<const std::uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "kiln fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

inline void write_file(const std::filesystem::path& path, std::string_view text) {
  write_file(path, {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
}

// A harness's own finding (a broken invariant): printed, then abort() so libFuzzer saves the input.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "\nkiln fuzz: FAILURE: %s\n", what.c_str());
  std::abort();
}

// Input made of two files: the bytes up to the first NUL, then the rest (empty when there is none).
inline std::pair<std::string_view, std::string_view> split_at_nul(const std::uint8_t* data, std::size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  auto nul = all.find('\0');
  if (nul == std::string_view::npos) return {all, {}};
  return {all.substr(0, nul), all.substr(nul + 1)};
}

// Runs `parse`; true when it returned, false when it refused the input with a kiln::Error whose
// message contains `name` (the file's name, as the user would recognise it). Anything else fails.
template <typename Parse>
bool parses(std::string_view name, Parse&& parse) {
  try {
    std::forward<Parse>(parse)();
    return true;
  } catch (const Error& e) {
    std::string_view message = e.what();
    if (message.find(name) == std::string_view::npos)
      fail("the error does not name " + std::string(name) + ": " + std::string(message));
    return false;
  } catch (const std::exception& e) {
    fail(std::string("a ") + typeid(e).name() + " escaped instead of a kiln::Error naming " + std::string(name) + ": " +
         e.what());
  }
}

}  // namespace kiln::fuzz
