#include "kiln/data/indexed_dataset_writer.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <string>

#include "kiln/runtime/error.h"

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

fs::path with_suffix(const fs::path& prefix, const char* suffix) { return fs::path(prefix.string() + suffix); }

fs::path temporary_name(const fs::path& target) {
  return fs::path(target.string() + ".tmp." + std::to_string(::getpid()));
}

fs::path backup_name(const fs::path& prefix) {
  return fs::path(prefix.string() + ".bin.old." + std::to_string(::getpid()));
}

// True when no process `pid` exists (kill(pid, 0) fails with ESRCH): its temporaries are stale.
bool process_is_gone(long pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

std::string error_text(const std::exception& e) {
  if (const auto* fe = dynamic_cast<const fs::filesystem_error*>(&e)) return fe->code().message();
  return e.what();
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
  remove_stale_files();
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

void IndexedDatasetWriter::remove_stale_files() {
  // Names finish() uses, by the process that made them: <prefix>.bin.tmp.P, .idx.tmp.P, .bin.old.P.
  struct Leftovers {
    fs::path bin_tmp, idx_tmp, backup;
  };
  std::map<long, Leftovers> by_pid;
  const std::string stem = prefix_.filename().string();
  const fs::path dir = prefix_.has_parent_path() ? prefix_.parent_path() : fs::path(".");
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::string name = it->path().filename().string();
    for (auto [tag, slot] : {std::pair{".bin.tmp.", &Leftovers::bin_tmp}, std::pair{".idx.tmp.", &Leftovers::idx_tmp},
                             std::pair{".bin.old.", &Leftovers::backup}}) {
      std::string head = stem + tag;
      if (!name.starts_with(head)) continue;
      std::string_view digits = std::string_view(name).substr(head.size());
      long pid = 0;
      auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
      if (err != std::errc() || end != digits.data() + digits.size() || !process_is_gone(pid)) continue;
      by_pid[pid].*slot = it->path();
    }
  }
  for (const auto& [pid, l] : by_pid) {
    // finish() renames the .bin only once the .idx is written whole: a complete .idx.tmp without
    // its .bin.tmp is a commit cut between its two renames. Finish it, or the new .bin would stay
    // beside the old .idx.
    if (!l.idx_tmp.empty() && l.bin_tmp.empty()) {
      fs::path idx_path = with_suffix(prefix_, ".idx");
      std::error_code rename_error;
      fs::rename(l.idx_tmp, idx_path, rename_error);
      KILN_CHECK(!rename_error,
                 "indexed dataset {}: process {} died committing it; cannot finish its commit by renaming "
                 "{} to {}: {}",
                 prefix_.string(), pid, l.idx_tmp.string(), idx_path.string(), rename_error.message());
      stale_files_removed_.push_back(
          fmt::format("completed the commit of process {}, which died between its two "
                      "renames: renamed {} to {}",
                      pid, l.idx_tmp.string(), idx_path.string()));
    } else if (!l.idx_tmp.empty()) {
      fs::remove(l.idx_tmp, ec);
      stale_files_removed_.push_back(
          fmt::format("removed {} (left by process {}, which is gone)", l.idx_tmp.string(), pid));
    }
    for (const fs::path& p : {l.bin_tmp, l.backup}) {
      if (p.empty()) continue;
      fs::remove(p, ec);
      stale_files_removed_.push_back(fmt::format("removed {} (left by process {}, which is gone)", p.string(), pid));
    }
  }
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
  commit_pair(idx_tmp);
  finished_ = true;
}

void IndexedDatasetWriter::commit_pair(const fs::path& idx_tmp) {
  const fs::path bin_path = with_suffix(prefix_, ".bin");
  const fs::path idx_path = with_suffix(prefix_, ".idx");
  auto rename = [&](const fs::path& from, const fs::path& to) {
    if (rename_) {
      rename_(from, to);
    } else {
      fs::rename(from, to);
    }
  };
  auto drop = [](const fs::path& p) {
    std::error_code ignored;
    fs::remove(p, ignored);
  };
  // Keep the old .bin reachable under a second name until the new .idx is in place: a hard link
  // (the .bin stays where it is for readers), or where the file system has none, the file itself.
  const fs::path backup = backup_name(prefix_);
  std::error_code ec;
  enum class Kept { Nothing, Linked, Moved } kept = Kept::Nothing;
  if (fs::exists(fs::symlink_status(bin_path, ec))) {
    if (::link(bin_path.c_str(), backup.c_str()) == 0) {
      kept = Kept::Linked;
    } else {
      fs::rename(bin_path, backup, ec);
      if (ec) {
        drop(bin_tmp_);
        drop(idx_tmp);
        KILN_FAIL(
            "indexed dataset {}: cannot keep the old {} while replacing it (link or rename to {}): {}; nothing "
            "was changed",
            prefix_.string(), bin_path.string(), backup.string(), ec.message());
      }
      kept = Kept::Moved;
    }
  }
  // The .bin first: a reader that finds the new .idx finds the .bin it describes.
  try {
    rename(bin_tmp_, bin_path);
  } catch (const std::exception& e) {
    if (kept == Kept::Moved) fs::rename(backup, bin_path, ec);
    if (kept == Kept::Linked) drop(backup);
    drop(bin_tmp_);
    drop(idx_tmp);
    KILN_FAIL("indexed dataset {}: cannot rename {} to {}: {}; the old dataset (if any) is unchanged", prefix_.string(),
              bin_tmp_.string(), bin_path.string(), error_text(e));
  }
  try {
    rename(idx_tmp, idx_path);
  } catch (const std::exception& e) {
    // Put the old .bin back beside the old .idx; with no old dataset, leave no lone .bin.
    std::error_code restore_error;
    if (kept == Kept::Nothing) {
      fs::remove(bin_path, restore_error);
    } else {
      fs::rename(backup, bin_path, restore_error);
    }
    drop(idx_tmp);
    KILN_CHECK(!restore_error,
               "indexed dataset {}: cannot rename {} to {}: {}; and restoring the old .bin failed too ({}): the old "
               ".bin is {}",
               prefix_.string(), idx_tmp.string(), idx_path.string(), error_text(e), restore_error.message(),
               backup.string());
    KILN_FAIL("indexed dataset {}: cannot rename {} to {}: {}; the old dataset (if any) was restored unchanged",
              prefix_.string(), idx_tmp.string(), idx_path.string(), error_text(e));
  }
  if (kept != Kept::Nothing) drop(backup);
}

}  // namespace kiln::data
