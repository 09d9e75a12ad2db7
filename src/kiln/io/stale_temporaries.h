#pragma once
// Stale temporaries: the files and folders a writer names after its process id while it works
// (AtomicFile's `<name>.tmp.<pid>`, save_safetensors' `.<name>.tmp.<pid>`, the CIFAR-10 fetch's
// `partial.<pid>`, `<folder>.partial.<pid>`, `<folder>.unpacked.<pid>`) and renames or removes when
// it is done. A process killed mid-write (SIGKILL, OOM, a power cut) leaves them behind, up to
// hundreds of MB; the next run removes those whose owner is gone and says so.
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::io {

// The owning process id of a temporary's file name, or nullopt when the name is not one of the
// temporary forms above.
std::optional<pid_t> temporary_owner(std::string_view file_name);

// True when the process that wrote a temporary last modified at `written` can no longer be
// writing it: no process has that id, or the process now holding the id started after the write
// (the id was reused). The calling process always counts as alive.
bool temporary_owner_gone(pid_t pid, std::filesystem::file_time_type written);

struct RemovedTemporary {
  std::filesystem::path path;
  std::uintmax_t bytes = 0;  // a folder counts the regular files inside it
};

// Removes the stale temporaries directly inside `dir` (not recursing; a missing folder holds
// none) and returns what it removed. A temporary that cannot be removed is skipped silently: it
// is someone else's file or a read-only folder, and the run proceeds either way.
std::vector<RemovedTemporary> remove_stale_temporaries(const std::filesystem::path& dir);

// "removed 2 stale temporaries left by interrupted runs (15.2 MB): a, b" (empty for none).
std::string describe_removed(const std::vector<RemovedTemporary>& removed);

}  // namespace kiln::io
