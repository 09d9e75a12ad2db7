#include "kiln/io/jsonl_writer.h"

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <system_error>

#include "kiln/runtime/error.h"

namespace kiln::io {

JsonlWriter::JsonlWriter(const std::filesystem::path& path, Mode mode) : path_(path) {
  if (path_.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(path_.parent_path(), ec);
    KILN_CHECK(!ec, "cannot create folder '{}' for '{}': {}", path_.parent_path().string(), path_.string(),
               ec.message());
  }
  file_ = std::fopen(path_.c_str(), mode == Mode::Append ? "ab" : "wb");
  KILN_CHECK(file_, "cannot open the JSON Lines log '{}': {}", path_.string(), std::strerror(errno));
}

JsonlWriter::~JsonlWriter() {
  if (file_) std::fclose(file_);
}

void JsonlWriter::write(const nlohmann::json& object) {
  KILN_CHECK(object.is_object(), "JSON Lines log '{}': each line must be a JSON object, got {}", path_.string(),
             object.type_name());
  // dump() escapes newlines inside strings, so one object is always exactly one line.
  const std::string line = object.dump() + "\n";
  KILN_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0,
             "cannot write to the JSON Lines log '{}': {}", path_.string(), std::strerror(errno));
}

}  // namespace kiln::io
