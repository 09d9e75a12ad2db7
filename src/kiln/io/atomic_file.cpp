#include "kiln/io/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "kiln/runtime/error.h"

namespace kiln::io {

AtomicFile::AtomicFile(std::filesystem::path path) : path_(std::move(path)) {
  KILN_CHECK(!path_.filename().empty(), "cannot write '{}': not a file name", path_.string());
  if (path_.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(path_.parent_path(), ec);
    KILN_CHECK(!ec, "cannot create folder '{}' for '{}': {}", path_.parent_path().string(), path_.string(),
               ec.message());
  }
  temp_path_ = path_;
  temp_path_ += ".tmp." + std::to_string(::getpid());
  file_ = std::fopen(temp_path_.c_str(), "wb");
  KILN_CHECK(file_, "cannot open '{}' for writing: {}", temp_path_.string(), std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (file_) std::fclose(file_);
  if (!committed_) {
    std::error_code ignored;
    std::filesystem::remove(temp_path_, ignored);
  }
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  KILN_CHECK(file_, "'{}' was already committed", path_.string());
  if (bytes == 0) return;
  KILN_CHECK(std::fwrite(data, 1, bytes, file_) == bytes, "cannot write {} bytes to '{}': {}", bytes,
             temp_path_.string(), std::strerror(errno));
}

void AtomicFile::commit() {
  KILN_CHECK(file_, "'{}' was already committed", path_.string());
  bool ok = std::fflush(file_) == 0 && !std::ferror(file_) && ::fsync(::fileno(file_)) == 0;
  int saved_errno = errno;
  ok = std::fclose(file_) == 0 && ok;
  file_ = nullptr;
  KILN_CHECK(ok, "cannot write '{}': {}", temp_path_.string(), std::strerror(saved_errno ? saved_errno : errno));
  std::error_code ec;
  std::filesystem::rename(temp_path_, path_, ec);
  KILN_CHECK(!ec, "cannot rename '{}' to '{}': {}", temp_path_.string(), path_.string(), ec.message());
  committed_ = true;
}

}  // namespace kiln::io
