#pragma once
// kiln::Error: the one exception type Kiln throws. Messages name the operation and the inputs
// involved; checked vendor calls add the call, file and line.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_error(const std::string& message, const char* file, int line);
}  // namespace detail

}  // namespace kiln

// KILN_CHECK(cond, "fmt {}", args...): throw kiln::Error with the formatted message when cond fails.
#define KILN_CHECK(cond, ...)                                                      \
  do {                                                                             \
    if (!(cond)) [[unlikely]]                                                      \
      ::kiln::detail::throw_error(::fmt::format(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)

#define KILN_FAIL(...) ::kiln::detail::throw_error(::fmt::format(__VA_ARGS__), __FILE__, __LINE__)
