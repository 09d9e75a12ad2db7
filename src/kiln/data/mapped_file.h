#pragma once
// A read-only memory map of a whole file (the .bin of an indexed dataset can be far larger than
// memory; pages come in as samples touch them).
#include <cstddef>
#include <filesystem>
#include <span>

namespace kiln::data {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws kiln::Error naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const unsigned char> bytes() const { return {data_, size_}; }
  std::size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kiln::data
