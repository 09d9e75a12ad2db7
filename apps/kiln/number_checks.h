#pragma once
// CLI11 validators for numeric flags, with messages a user reads ("--batch-size: must be a whole
// number >= 1, got '0'") instead of CLI11's ranges up to 1.8e308, and no NaN slipping through.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <string>

namespace kiln::cli {

inline CLI::Validator whole_number_at_least(long long min) {
  return CLI::Validator(
      [min](std::string& input) -> std::string {
        long long value = 0;
        auto [end, ec] = std::from_chars(input.data(), input.data() + input.size(), value);
        if (ec != std::errc() || end != input.data() + input.size() || value < min)
          return fmt::format("must be a whole number >= {}, got '{}'", min, input);
        return "";
      },
      fmt::format("INT>={}", min));
}

// A finite number above `min` (or at least `min` when inclusive).
inline CLI::Validator finite_number_above(double min, bool inclusive = false) {
  return CLI::Validator(
      [min, inclusive](std::string& input) -> std::string {
        double value = 0;
        auto [end, ec] = std::from_chars(input.data(), input.data() + input.size(), value);
        if (ec != std::errc() || end != input.data() + input.size() || !std::isfinite(value) ||
            (inclusive ? value < min : value <= min))
          return fmt::format("must be a finite number {} {}, got '{}'", inclusive ? ">=" : ">", min, input);
        return "";
      },
      fmt::format("NUMBER{}{}", inclusive ? ">=" : ">", min));
}

}  // namespace kiln::cli
