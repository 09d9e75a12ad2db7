#pragma once
// One function per `kiln` subcommand, each in its own cmd_<name>.cpp. main.cpp lists them.
#include <CLI/CLI.hpp>

namespace kiln::cli {

void add_check_device(CLI::App& app);

}  // namespace kiln::cli
