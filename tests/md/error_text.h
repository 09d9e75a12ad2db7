#pragma once
// The message of the exception `f` throws, or "" when it throws none (for tests of refusals).
#include <exception>
#include <functional>
#include <string>

namespace kiln::md_test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace kiln::md_test
