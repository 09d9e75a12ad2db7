#pragma once
// Output files of kiln mdrun are written to `<name>.tmp.<pid>`, synced and renamed over the target,
// so a crash or a full disk never leaves a cut confout.gro or energy.json under the real name.
// (hpc/ sits below io/, whose AtomicFile does the same for the upper layers.)
#include <filesystem>
#include <string_view>

namespace kiln::md {

void write_file_atomically(const std::filesystem::path& path, std::string_view text);

}  // namespace kiln::md
