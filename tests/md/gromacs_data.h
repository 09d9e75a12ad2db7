#pragma once
// Where Debian's gromacs-data keeps its topologies: the first entry of $GMXLIB (as GROMACS reads it),
// else /usr/share/gromacs/top. The H200 machine has no such package installed; there the carried
// .deb is unpacked and GMXLIB points at it (tools/gpu-build.sh).
#include <cstdlib>
#include <filesystem>
#include <string>

namespace kiln::md_test {

inline std::filesystem::path gromacs_top() {
  if (const char* lib = std::getenv("GMXLIB"); lib != nullptr && *lib != '\0') {
    const std::string s(lib);
    return s.substr(0, s.find(':'));
  }
  return "/usr/share/gromacs/top";
}

}  // namespace kiln::md_test
