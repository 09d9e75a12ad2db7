#pragma once
// Whitespace trimming for the line-oriented GROMACS text formats (.gro, .mdp, .top): their fields
// are padded with spaces and tabs, and files written on Windows end their lines in "\r".
#include <string>
#include <string_view>

namespace kiln::md {

inline std::string trim(std::string_view s) {
  const std::size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const std::size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace kiln::md
