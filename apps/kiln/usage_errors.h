#pragma once
// CLI11 answers an unknown subcommand with "A subcommand is required" and a misspelt flag with "The
// following argument was not expected". This walks the command line the way CLI11 does and names the
// word that is wrong, where it is (`kiln hpl`), what was probably meant, and what is known there.
#include <CLI/CLI.hpp>
#include <string>

namespace kiln::cli {

// The error line(s) for a command line CLI11 refused, starting with the command it was for: for an
// unknown or missing word, what was wrong and what is known there ("kiln hpl: error: unknown option
// '--dept'; did you mean '--depth'? ..."); for anything else (a value that does not convert, a
// missing required option), CLI11's own message.
std::string usage_error_message(CLI::App& app, const CLI::ParseError& error, int argc, const char* const* argv);

}  // namespace kiln::cli
