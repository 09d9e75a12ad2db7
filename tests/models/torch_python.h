#pragma once
// The Python the PyTorch parity tests run: $KILN_PARITY_PYTHON, else /usr/bin/python3 (Debian's
// torch), else python3 on PATH, the first that imports torch; "" when none does.
#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace kiln::models::test_python {

inline bool runs(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

inline std::string find_torch_python() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("KILN_PARITY_PYTHON")) candidates.push_back(env);
  candidates.push_back("/usr/bin/python3");
  candidates.push_back("python3");
  for (const std::string& python : candidates)
    if (runs(fmt::format("{} -c 'import torch'", python))) return python;
  return "";
}

}  // namespace kiln::models::test_python
