#pragma once
// Runs an external program (npm, tar) without a shell: arguments are passed as they are, so
// paths with spaces or quotes need no escaping and cannot inject commands.
#include <filesystem>
#include <string>
#include <vector>

namespace kiln::io {

struct ProcessResult {
  int exit_code = -1;  // the program's exit status; 128 + N when killed by signal N
  std::string output;  // stdout and stderr together, for error messages
};

// Runs argv[0] (looked up in PATH) with the arguments, in `working_dir` (empty: the current one),
// and waits for it. Throws kiln::Error only when the program cannot be started.
ProcessResult run_process(const std::vector<std::string>& argv, const std::filesystem::path& working_dir = {});

// True when `program` is found in PATH.
bool program_in_path(const std::string& program);

}  // namespace kiln::io
