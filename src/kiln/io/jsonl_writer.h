#pragma once
// JsonlWriter: a JSON Lines log (one JSON object per line), appended to and flushed line by line
// so that a crash loses at most the line being written and `tail -f` shows progress live.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>

namespace kiln::io {

class JsonlWriter {
 public:
  enum class Mode { Append, Truncate };
  // Creates the parent folder if needed; Append keeps earlier lines (a resumed run), Truncate
  // starts the file afresh.
  explicit JsonlWriter(const std::filesystem::path& path, Mode mode = Mode::Append);
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;

  // Writes `object` (which must be a JSON object) as one line and flushes it.
  void write(const nlohmann::json& object);

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace kiln::io
