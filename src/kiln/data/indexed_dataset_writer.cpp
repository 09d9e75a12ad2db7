#include "kiln/data/indexed_dataset_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "kiln/runtime/error.h"

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

fs::path with_suffix(const fs::path& prefix, const char* suffix) { return fs::path(prefix.string() + suffix); }

fs::path temporary_name(const fs::path& target) {
  return fs::path(target.string() + ".tmp." + std::to_string(::getpid()));
}

template <typename T>
void append_le(std::string& out, T value) {
  // Kiln builds for little-endian hosts only (x86-64, aarch64), which is what the format is.
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void write_all(std::FILE* f, const void* data, std::size_t size, const fs::path& path) {
  KILN_CHECK(std::fwrite(data, 1, size, f) == size, "cannot write {}: {}", path.string(), std::strerror(errno));
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(fs::path prefix, TokenDtype dtype)
    : prefix_(std::move(prefix)), dtype_(dtype), item_size_(dtype_size(static_cast<std::uint8_t>(dtype))) {
  KILN_CHECK(dtype != TokenDtype::Float32 && dtype != TokenDtype::Float64 && item_size_ > 0,
             "indexed dataset {}: dtype {} cannot hold token ids", prefix_.string(), dtype_name(dtype));
  if (prefix_.has_parent_path()) fs::create_directories(prefix_.parent_path());
  bin_tmp_ = temporary_name(with_suffix(prefix_, ".bin"));
  bin_ = std::fopen(bin_tmp_.c_str(), "wb");
  KILN_CHECK(bin_ != nullptr, "cannot create {}: {}", bin_tmp_.string(), std::strerror(errno));
  std::setvbuf(bin_, nullptr, _IOFBF, 1 << 20);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finished_) discard();
}

void IndexedDatasetWriter::discard() {
  if (bin_) std::fclose(bin_);
  bin_ = nullptr;
  std::error_code ignored;
  fs::remove(bin_tmp_, ignored);
}

void IndexedDatasetWriter::write_tokens(std::span<const std::int32_t> tokens) {
  std::int64_t lo = 0, hi = 0;
  switch (dtype_) {
    case TokenDtype::UInt8: hi = 255; break;
    case TokenDtype::Int8: lo = -128, hi = 127; break;
    case TokenDtype::Int16: lo = -32768, hi = 32767; break;
    case TokenDtype::UInt16: hi = 65535; break;
    default: lo = INT32_MIN, hi = INT32_MAX; break;
  }
  buffer_.resize(tokens.size() * item_size_);
  unsigned char* out = buffer_.data();
  for (std::int32_t t : tokens) {
    KILN_CHECK(t >= lo && t <= hi, "indexed dataset {}: token id {} does not fit its dtype {}", prefix_.string(), t,
               dtype_name(dtype_));
    std::int64_t wide = t;
    std::memcpy(out, &wide, item_size_);  // little-endian: the low bytes come first
    out += item_size_;
  }
  write_all(bin_, buffer_.data(), buffer_.size(), bin_tmp_);
  tokens_ += static_cast<std::int64_t>(tokens.size());
}

void IndexedDatasetWriter::add_document(std::span<const std::int32_t> tokens) {
  KILN_CHECK(!finished_, "indexed dataset {}: add_document after finish", prefix_.string());
  if (!tokens.empty()) {
    KILN_CHECK(tokens.size() <= static_cast<std::size_t>(INT32_MAX),
               "indexed dataset {}: a document of {} tokens is longer than the format's int32 length", prefix_.string(),
               tokens.size());
    write_tokens(tokens);
    sequence_lengths_.push_back(static_cast<std::int32_t>(tokens.size()));
  }
  document_indices_.push_back(static_cast<std::int64_t>(sequence_lengths_.size()));
}

void IndexedDatasetWriter::add_document(std::span<const std::int32_t> tokens,
                                        std::span<const std::int32_t> sequence_lengths) {
  KILN_CHECK(!finished_, "indexed dataset {}: add_document after finish", prefix_.string());
  std::int64_t sum = 0;
  for (std::int32_t n : sequence_lengths) {
    KILN_CHECK(n >= 0, "indexed dataset {}: negative sequence length {}", prefix_.string(), n);
    sum += n;
  }
  KILN_CHECK(sum == static_cast<std::int64_t>(tokens.size()),
             "indexed dataset {}: sequence lengths sum to {} but the document has {} tokens", prefix_.string(), sum,
             tokens.size());
  write_tokens(tokens);
  sequence_lengths_.insert(sequence_lengths_.end(), sequence_lengths.begin(), sequence_lengths.end());
  document_indices_.push_back(static_cast<std::int64_t>(sequence_lengths_.size()));
}

void IndexedDatasetWriter::finish() {
  KILN_CHECK(!finished_, "indexed dataset {}: finish called twice", prefix_.string());
  KILN_CHECK(std::fflush(bin_) == 0 && ::fsync(::fileno(bin_)) == 0, "cannot write {}: {}", bin_tmp_.string(),
             std::strerror(errno));
  KILN_CHECK(std::fclose(bin_) == 0, "cannot write {}: {}", bin_tmp_.string(), std::strerror(errno));
  bin_ = nullptr;

  std::string index;
  index.reserve(34 + sequence_lengths_.size() * 12 + document_indices_.size() * 8);
  index.append(kIndexMagic);
  append_le<std::uint64_t>(index, kIndexVersion);
  append_le<std::uint8_t>(index, static_cast<std::uint8_t>(dtype_));
  append_le<std::uint64_t>(index, sequence_lengths_.size());
  append_le<std::uint64_t>(index, document_indices_.size());
  for (std::int32_t n : sequence_lengths_) append_le<std::int32_t>(index, n);
  std::int64_t pointer = 0;
  for (std::int32_t n : sequence_lengths_) {
    append_le<std::int64_t>(index, pointer);
    pointer += static_cast<std::int64_t>(n) * item_size_;
  }
  for (std::int64_t d : document_indices_) append_le<std::int64_t>(index, d);

  fs::path idx_path = with_suffix(prefix_, ".idx");
  fs::path idx_tmp = temporary_name(idx_path);
  std::FILE* f = std::fopen(idx_tmp.c_str(), "wb");
  KILN_CHECK(f != nullptr, "cannot create {}: {}", idx_tmp.string(), std::strerror(errno));
  bool ok =
      std::fwrite(index.data(), 1, index.size(), f) == index.size() && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::error_code ignored;
    fs::remove(idx_tmp, ignored);
    KILN_FAIL("cannot write {}: {}", idx_tmp.string(), std::strerror(errno));
  }
  // The .bin first: a reader that finds the new .idx finds the .bin it describes.
  fs::rename(bin_tmp_, with_suffix(prefix_, ".bin"));
  fs::rename(idx_tmp, idx_path);
  finished_ = true;
}

}  // namespace kiln::data
