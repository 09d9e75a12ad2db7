#pragma once
// CLI11 answers an unknown subcommand with "A subcommand is required" and a misspelt flag with "The
// following argument was not expected". This walks the command line the way CLI11 does and names the
// word that is wrong, where it is (`kiln hpl`), what was probably meant, and what is known there.
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace kiln::cli {

// The error line(s) for a command line CLI11 refused ("kiln hpl: error: unknown option '--dept'; did
// you mean '--depth'? ..."), or nothing when the refusal is not about an unknown or missing word (a
// bad value, a missing required option: CLI11's own message says that).
std::optional<std::string> explain_unknown_arguments(CLI::App& app, int argc, const char* const* argv);

}  // namespace kiln::cli
