#pragma once
// Appends trajectory frames to a file so that a crash never damages the frames already written:
// each frame goes out with one append (O_APPEND) and earlier bytes are never rewritten, so at worst
// the last frame is cut short. A run continued from a checkpoint first cuts the file back to its
// whole frames before the checkpoint's step (as gmx mdrun -cpi does with its outputs), which also
// removes such a cut frame and the frames the crashed run wrote after its last checkpoint.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>

namespace kiln::md {

class TrajectoryOutput {
 public:
  // `bytes_to_keep(contents, step)`: the length of the leading frames to keep when resuming at `step`.
  using KeepFunction = std::size_t (*)(std::string_view, std::int64_t);
  // A fresh run (no resume_step) starts the file empty.
  TrajectoryOutput(std::filesystem::path path, std::optional<std::int64_t> resume_step, KeepFunction bytes_to_keep);
  ~TrajectoryOutput();
  TrajectoryOutput(const TrajectoryOutput&) = delete;
  TrajectoryOutput& operator=(const TrajectoryOutput&) = delete;

  void append(std::string_view frame);
  // Flushes to the disk, before a checkpoint claims these frames.
  void sync();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace kiln::md
