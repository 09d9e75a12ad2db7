#include "kiln/data/indexed_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "kiln/runtime/error.h"

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

fs::path strip_suffix(fs::path prefix) {
  std::string s = prefix.string();
  if (s.ends_with(".bin") || s.ends_with(".idx")) s.resize(s.size() - 4);
  return s;
}

// Reads little-endian fields from the index, failing with the file and the field when it ends early.
class IndexReader {
 public:
  IndexReader(std::span<const unsigned char> bytes, const fs::path& path) : bytes_(bytes), path_(path) {}

  template <typename T>
  T scalar(const char* field) {
    T value;
    need(sizeof(T), 1, field);
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  template <typename T>
  void array(std::vector<T>& out, std::uint64_t count, const char* field) {
    need(sizeof(T), count, field, true);
    out.resize(count);
    // memcpy: the arrays start at odd offsets (34 for the lengths), so they are not aligned.
    if (count > 0) std::memcpy(out.data(), bytes_.data() + pos_, count * sizeof(T));
    pos_ += count * sizeof(T);
  }

  void skip(std::size_t size, const char* field) {
    need(1, size, field);
    pos_ += size;
  }

  std::size_t position() const { return pos_; }

 private:
  void need(std::size_t size, std::uint64_t count, const char* field, bool array = false) {
    std::uint64_t left = bytes_.size() - pos_;
    if (count <= left / size) return;
    // count * size may not fit 64 bits (a damaged count of 2^63 would read "needs 0 bytes").
    std::string needed = count <= UINT64_MAX / size ? fmt::format("{} bytes", count * size)
                                                    : fmt::format("{} x {} bytes (more than 2^64)", count, size);
    if (!array) {
      KILN_FAIL("{} is truncated: {} needs {} at offset {}, the file has {} bytes", path_.string(), field, needed, pos_,
                bytes_.size());
    }
    KILN_FAIL(
        "{} is truncated or damaged: {} ({} entries, from the header) need {} at offset {}, the file has {} bytes",
        path_.string(), field, count, needed, pos_, bytes_.size());
  }

  std::span<const unsigned char> bytes_;
  const fs::path& path_;
  std::size_t pos_ = 0;
};

}  // namespace

IndexedDataset::IndexedDataset(fs::path prefix) : prefix_(strip_suffix(std::move(prefix))) {
  fs::path idx_path = prefix_.string() + ".idx";
  fs::path bin_path = prefix_.string() + ".bin";
  {
    MappedFile idx(idx_path);
    index_file_size_ = idx.size();
    IndexReader in(idx.bytes(), idx_path);
    KILN_CHECK(idx.size() >= kIndexMagic.size() &&
                   std::memcmp(idx.bytes().data(), kIndexMagic.data(), kIndexMagic.size()) == 0,
               "{} is not a Megatron indexed dataset index: it does not start with \"MMIDIDX\\0\\0\"",
               idx_path.string());
    in.skip(kIndexMagic.size(), "the magic");
    auto version = in.scalar<std::uint64_t>("the version");
    KILN_CHECK(version == kIndexVersion, "{}: index version {} is not supported (only version 1)", idx_path.string(),
               version);
    auto code = in.scalar<std::uint8_t>("the dtype code");
    item_size_ = dtype_size(code);
    KILN_CHECK(item_size_ > 0, "{}: dtype code {} is not a known dtype (1..8)", idx_path.string(), code);
    dtype_ = static_cast<TokenDtype>(code);
    KILN_CHECK(dtype_ != TokenDtype::Float32 && dtype_ != TokenDtype::Float64, "{}: dtype {} does not hold token ids",
               idx_path.string(), dtype_name(dtype_));
    auto sequences = in.scalar<std::uint64_t>("the sequence count");
    auto documents = in.scalar<std::uint64_t>("the document count");
    in.array(sequence_lengths_, sequences, "the sequence lengths");
    in.array(sequence_pointers_, sequences, "the sequence pointers");
    in.array(document_indices_, documents, "the document indices");
    KILN_CHECK(in.position() == idx.size(),
               "{}: {} bytes after the document indices (the header says {} sequences, "
               "{} document indices)",
               idx_path.string(), idx.size() - in.position(), sequences, documents);
  }
  KILN_CHECK(!document_indices_.empty() && document_indices_.front() == 0,
             "{}.idx: the document indices must start with 0", prefix_.string());
  for (std::size_t d = 1; d < document_indices_.size(); ++d) {
    KILN_CHECK(document_indices_[d] >= document_indices_[d - 1] && document_indices_[d] <= sequence_count(),
               "{}.idx: document index {} ({}) is out of order or past the {} sequences", prefix_.string(), d,
               document_indices_[d], sequence_count());
  }
  KILN_CHECK(document_indices_.back() == sequence_count(),
             "{}.idx: the last document index is {}, not the sequence count {}", prefix_.string(),
             document_indices_.back(), sequence_count());

  bin_ = MappedFile(bin_path);
  auto bin_size = static_cast<std::int64_t>(bin_.size());
  std::int64_t data_end = 0;
  for (std::size_t i = 0; i < sequence_lengths_.size(); ++i) {
    std::int64_t length = sequence_lengths_[i];
    std::int64_t pointer = sequence_pointers_[i];
    KILN_CHECK(length >= 0, "{}.idx: sequence {} has negative length {}", prefix_.string(), i, length);
    KILN_CHECK(
        pointer >= 0 && pointer % item_size_ == 0 && pointer <= bin_size && length <= (bin_size - pointer) / item_size_,
        "{}: sequence {} ({} tokens at byte {}) lies outside the {}-byte .bin (truncated, or not this "
        "index's .bin?)",
        bin_path.string(), i, length, pointer, bin_size);
    token_count_ += length;
    data_end = std::max(data_end, pointer + length * item_size_);
  }
  // Megatron's builder writes the sequences back to back, so the .bin ends where the last one does.
  // A larger .bin is another dataset's (its first bytes would decode as text that is not this
  // index's), a smaller one is truncated: either way the pair does not belong together.
  KILN_CHECK(bin_size == data_end,
             "{} has {} bytes, but {}.idx describes {} bytes of tokens ({} tokens of {} bytes): the .bin is {} (is it "
             "this index's .bin?)",
             bin_path.string(), bin_size, prefix_.string(), data_end, token_count_, item_size_,
             bin_size > data_end ? "longer than its index says" : "shorter than its index says");
}

void IndexedDataset::read(std::int64_t sequence, std::int64_t offset, std::int64_t length, std::int32_t* out) const {
  KILN_CHECK(sequence >= 0 && sequence < sequence_count(), "{}: sequence {} out of range (0..{})", prefix_.string(),
             sequence, sequence_count());
  KILN_CHECK(offset >= 0 && length >= 0 && offset + length <= sequence_lengths_[sequence],
             "{}: tokens [{}, {}) of sequence {} are outside its {} tokens", prefix_.string(), offset, offset + length,
             sequence, sequence_lengths_[sequence]);
  const unsigned char* p = bin_.bytes().data() + sequence_pointers_[sequence] + offset * item_size_;
  auto convert = [&]<typename T>(T) {
    for (std::int64_t i = 0; i < length; ++i) {
      T v;
      std::memcpy(&v, p + i * sizeof(T), sizeof(T));
      out[i] = static_cast<std::int32_t>(v);
    }
  };
  switch (dtype_) {
    case TokenDtype::UInt8: convert(std::uint8_t{}); break;
    case TokenDtype::Int8: convert(std::int8_t{}); break;
    case TokenDtype::Int16: convert(std::int16_t{}); break;
    case TokenDtype::UInt16: convert(std::uint16_t{}); break;
    case TokenDtype::Int32: convert(std::int32_t{}); break;
    case TokenDtype::Int64: convert(std::int64_t{}); break;
    default: KILN_FAIL("{}: dtype {} does not hold token ids", prefix_.string(), dtype_name(dtype_));
  }
}

std::vector<std::int32_t> IndexedDataset::sequence(std::int64_t sequence) const {
  KILN_CHECK(sequence >= 0 && sequence < sequence_count(), "{}: sequence {} out of range (0..{})", prefix_.string(),
             sequence, sequence_count());
  std::vector<std::int32_t> out(sequence_lengths_[sequence]);
  read(sequence, 0, static_cast<std::int64_t>(out.size()), out.data());
  return out;
}

std::vector<std::int32_t> IndexedDataset::document(std::int64_t document) const {
  KILN_CHECK(document >= 0 && document < document_count(), "{}: document {} out of range (0..{})", prefix_.string(),
             document, document_count());
  std::vector<std::int32_t> out;
  for (std::int64_t s = document_indices_[document]; s < document_indices_[document + 1]; ++s) {
    std::size_t at = out.size();
    out.resize(at + sequence_lengths_[s]);
    read(s, 0, sequence_lengths_[s], out.data() + at);
  }
  return out;
}

}  // namespace kiln::data
