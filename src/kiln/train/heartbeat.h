#pragma once
// The rank side of `kiln launch`'s hang detection (docs/launch.md). When KILN_HEARTBEAT_DIR is set
// (by `kiln launch`), each rank keeps the file <dir>/rank_<R> (R: the launcher's rank,
// dist/launch_environment.h) and rewrites it with the iteration at the start of every training
// iteration; the supervisor notices a file that stops changing. One pwrite() of a few bytes into a
// file kept open: no allocation, no fsync, nothing when the variable is unset.
#include <cstdint>
#include <filesystem>
#include <string>

namespace kiln::train {

class Heartbeat {
 public:
  // Off unless KILN_HEARTBEAT_DIR is set; then the file is created at once (an error names it).
  static Heartbeat from_environment();
  Heartbeat() = default;
  Heartbeat(const std::filesystem::path& dir, int rank);
  Heartbeat(Heartbeat&& other) noexcept;
  Heartbeat& operator=(Heartbeat&& other) noexcept;
  ~Heartbeat();

  bool enabled() const { return fd_ >= 0; }
  void beat(std::int64_t iteration);
  // Training is over (what follows, final saves and evaluation, is not timed by the heartbeat).
  void finish();

  // "rank_3": the file a rank beats in; the supervisor reads the same names.
  static std::string file_name(int rank);
  // The iteration a heartbeat file holds, or -1 when it is empty or unreadable (or says done).
  static std::int64_t read_iteration(const std::filesystem::path& file);
  // What finish() writes in place of an iteration.
  static constexpr const char* kDone = "done";

 private:
  int fd_ = -1;
};

}  // namespace kiln::train
