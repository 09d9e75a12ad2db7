#pragma once
// AtomicFile: writes go to a temporary file beside the target, which is renamed over the target
// only on commit(). A crash, an exception or a full disk never leaves a half-written file under the
// real name, so a reader (or a second run) sees either the old file or the complete new one.
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <string_view>

namespace kiln::io {

class AtomicFile {
 public:
  // Creates the parent folder if needed and opens `<path>.tmp.<pid>` for writing.
  explicit AtomicFile(std::filesystem::path path);
  // Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // For libraries that write to a FILE* themselves (libpng). Check errors with commit().
  std::FILE* stream() { return file_; }
  // Flushes, syncs and renames the temporary file over the target. Throws naming the file on error.
  void commit();

  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& temp_path() const { return temp_path_; }

 private:
  std::filesystem::path path_;
  std::filesystem::path temp_path_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

}  // namespace kiln::io
