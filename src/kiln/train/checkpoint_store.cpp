#include "kiln/train/checkpoint_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>  // renameat2, RENAME_EXCHANGE (glibc, _GNU_SOURCE)
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/io/atomic_file.h"
#include "kiln/io/crc32c.h"
#include "kiln/io/safetensors.h"
#include "kiln/io/stale_temporaries.h"
#include "kiln/train/fault_injection.h"

namespace kiln::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "kiln-checkpoint";
constexpr int kVersion = 1;

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  KILN_CHECK(fd >= 0, "cannot open folder {} to sync it: {}", dir.string(), std::strerror(errno));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  KILN_CHECK(rc == 0, "fsync of folder {} failed: {}", dir.string(), std::strerror(saved));
}

// One file of a checkpoint being written: raw write(2)s (so ENOSPC surfaces at the write that met
// it), CRC-32C of everything written, fsync before close.
class ChecksummedFile {
 public:
  explicit ChecksummedFile(fs::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    KILN_CHECK(fd_ >= 0, "cannot create {}: {}", path_.string(), std::strerror(errno));
  }
  ~ChecksummedFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  ChecksummedFile(const ChecksummedFile&) = delete;
  ChecksummedFile& operator=(const ChecksummedFile&) = delete;

  // `fail_with`: an errno to fail this write with as if the kernel had returned it (fault hook).
  void write(const void* data, std::size_t size, int fail_with = 0) {
    crc_ = io::crc32c(data, size, crc_);
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      ssize_t n = fail_with ? -1 : ::write(fd_, p, size);
      if (fail_with) errno = fail_with;
      if (n < 0 && errno == EINTR) continue;
      KILN_CHECK(n > 0, "writing {} failed after {} bytes: {}", path_.string(), bytes_, std::strerror(errno));
      p += n;
      size -= static_cast<std::size_t>(n);
      bytes_ += static_cast<std::uint64_t>(n);
    }
  }
  void finish() {
    KILN_CHECK(::fsync(fd_) == 0, "fsync of {} failed: {}", path_.string(), std::strerror(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    KILN_CHECK(rc == 0, "closing {} failed: {}", path_.string(), std::strerror(errno));
  }
  std::uint32_t crc() const { return crc_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  fs::path path_;
  int fd_ = -1;
  std::uint32_t crc_ = 0;
  std::uint64_t bytes_ = 0;
};

// Size and CRC-32C of a file, read in 4 MiB pieces.
std::pair<std::uint64_t, std::uint32_t> size_and_crc(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "cannot open it: {}", std::strerror(errno));
  std::vector<char> buffer(4 << 20);
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    crc = io::crc32c(buffer.data(), n, crc);
    bytes += n;
  }
  KILN_CHECK(in.eof(), "reading it failed: {}", std::strerror(errno));
  return {bytes, crc};
}

struct Manifest {
  std::int64_t iteration = 0;
  struct File {
    std::string name;
    std::uint64_t bytes = 0;
    std::uint32_t crc32c = 0;
    bool text = false;  // a text file of CheckpointContent::text_files (not loaded as tensors)
  };
  std::vector<File> files;
  CheckpointMetadata metadata;
};

std::string manifest_text(const Manifest& m) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["iteration"] = m.iteration;
  j["files"] = nlohmann::ordered_json::array();
  for (const auto& f : m.files)
    j["files"].push_back({{"name", f.name},
                          {"bytes", f.bytes},
                          {"crc32c", fmt::format("{:08x}", f.crc32c)},
                          {"kind", f.text ? "text" : "safetensors"}});
  j["metadata"] = m.metadata;
  return j.dump(1) + "\n";
}

// Parses manifest.json of `dir`; throws with the reason.
Manifest read_manifest(const fs::path& dir) {
  const fs::path path = dir / CheckpointStore::kManifest;
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "no {}", CheckpointStore::kManifest);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
    KILN_CHECK(j.value("format", "") == kFormat, "{} is not a {} manifest", CheckpointStore::kManifest, kFormat);
    KILN_CHECK(j.at("version").get<int>() == kVersion, "{}: version {} (this build reads {})",
               CheckpointStore::kManifest, j.at("version").dump(), kVersion);
    Manifest m;
    m.iteration = j.at("iteration").get<std::int64_t>();
    for (const auto& f : j.at("files")) {
      Manifest::File file;
      file.name = f.at("name").get<std::string>();
      file.bytes = f.at("bytes").get<std::uint64_t>();
      file.text = f.value("kind", std::string("safetensors")) == "text";
      const std::string crc = f.at("crc32c").get<std::string>();
      auto [end, ec] = std::from_chars(crc.data(), crc.data() + crc.size(), file.crc32c, 16);
      KILN_CHECK(ec == std::errc() && end == crc.data() + crc.size(), "crc32c '{}' of {} is not hexadecimal", crc,
                 file.name);
      KILN_CHECK(!file.name.empty() && file.name.find('/') == std::string::npos, "file name '{}' is not a plain name",
                 file.name);
      m.files.push_back(file);
    }
    m.metadata = j.at("metadata").get<CheckpointMetadata>();
    return m;
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("{} is malformed: {}", CheckpointStore::kManifest, e.what());
  }
}

// Why the files of `dir` do not match its manifest, or nullopt when they all do.
std::optional<std::string> check_files(const fs::path& dir, const Manifest& m) {
  for (const auto& f : m.files) {
    std::error_code ec;
    if (!fs::exists(dir / f.name, ec)) return fmt::format("{} is missing", f.name);
    try {
      auto [bytes, crc] = size_and_crc(dir / f.name);
      if (bytes != f.bytes)
        return fmt::format("{} has {} bytes, the manifest says {} (truncated or overwritten)", f.name, bytes, f.bytes);
      if (crc != f.crc32c)
        return fmt::format("{}: crc32c {:08x} but the manifest says {:08x} (the data is damaged)", f.name, crc,
                           f.crc32c);
    } catch (const Error& e) {
      return fmt::format("{}: {}", f.name, e.what());
    }
  }
  return std::nullopt;
}

// Flips one byte in the middle of the first file of a checkpoint: what bit rot or a bad disk does.
void corrupt_for_fault(const fs::path& dir, const Manifest& m) {
  if (m.files.empty()) return;
  const fs::path file = dir / m.files.front().name;
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = static_cast<std::streamoff>(m.files.front().bytes / 2);
  f.seekg(at);
  char c = 0;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x5a));
  fmt::print("fault injection: flipped a byte of {} (KILN_FAULT corrupt_checkpoint)\n", file.string());
}

}  // namespace

std::string iteration_dir_name(std::int64_t iteration) { return fmt::format("iter_{:07}", iteration); }

std::optional<std::int64_t> parse_iteration_dir(const std::string& name) {
  if (!name.starts_with("iter_") || name.size() < 6) return std::nullopt;
  std::int64_t value = 0;
  const char* begin = name.data() + 5;
  auto [end, ec] = std::from_chars(begin, name.data() + name.size(), value);
  if (ec != std::errc() || end != name.data() + name.size() || value < 0) return std::nullopt;
  return value;
}

const TensorDict& LoadedCheckpoint::file(const std::string& name) const {
  for (const auto& [n, tensors] : files)
    if (n == name) return tensors;
  KILN_FAIL("checkpoint {} has no {}", dir.string(), name);
}

CheckpointStore::CheckpointStore(fs::path root, CheckpointStoreOptions options)
    : root_(std::move(root)), options_(options) {
  KILN_CHECK(options_.keep_last >= 0, "--keep-last must be >= 0 (0: keep all), got {}", options_.keep_last);
  fs::create_directories(root_);
  const auto removed = io::remove_stale_temporaries(root_);
  if (!removed.empty()) fmt::print("{}\n", io::describe_removed(removed));
}

fs::path CheckpointStore::dir_of(std::int64_t iteration) const { return root_ / iteration_dir_name(iteration); }

std::vector<std::int64_t> CheckpointStore::iterations() const {
  std::vector<std::int64_t> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec))
    if (auto it = parse_iteration_dir(entry.path().filename().string()); it && entry.is_directory()) out.push_back(*it);
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::int64_t> CheckpointStore::tracked_iteration() const {
  std::ifstream in(root_ / kTracker);
  std::int64_t it = -1;
  if (!(in >> it) || it < 0) return std::nullopt;
  return it;
}

fs::path CheckpointStore::save(const CheckpointContent& content) {
  KILN_CHECK(content.iteration >= 0, "checkpoint iteration must be >= 0, got {}", content.iteration);
  const std::int64_t save_number = ++saves_;
  const bool kill_midway = fault_fires(FaultKind::KillInSave, save_number);
  const bool disk_full = fault_fires(FaultKind::DiskFullInSave, save_number);
  const std::string name = iteration_dir_name(content.iteration);
  const fs::path final_dir = root_ / name;
  const fs::path tmp_dir = root_ / fmt::format(".{}.tmp.{}", name, ::getpid());
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  try {
    fs::create_directories(tmp_dir);
    Manifest manifest;
    manifest.iteration = content.iteration;
    manifest.metadata = content.metadata;
    for (const auto& [file_name, tensors] : content.files) {
      KILN_CHECK(!file_name.empty() && file_name.find('/') == std::string::npos && file_name != kManifest,
                 "checkpoint file name '{}' must be a plain name other than {}", file_name, kManifest);
      ChecksummedFile out(tmp_dir / file_name);
      std::uint64_t pieces = 0;
      io::write_safetensors(tensors, {}, [&](const void* data, std::size_t bytes) {
        // Fault hooks, after the first piece (the header length) is on disk: a half-written file.
        int fail_with = 0;
        if (pieces++ == 1 && manifest.files.empty()) {
          if (kill_midway) {
            fmt::print("fault injection: SIGKILL while writing {} (KILN_FAULT kill_in_save@{})\n",
                       (tmp_dir / file_name).string(), save_number);
            std::fflush(stdout);
            std::raise(SIGKILL);
          }
          if (disk_full) fail_with = ENOSPC;
        }
        out.write(data, bytes, fail_with);
      });
      out.finish();
      manifest.files.push_back({file_name, out.bytes(), out.crc()});
    }
    for (const auto& [file_name, text] : content.text_files) {
      KILN_CHECK(!file_name.empty() && file_name.find('/') == std::string::npos && file_name != kManifest,
                 "checkpoint file name '{}' must be a plain name other than {}", file_name, kManifest);
      ChecksummedFile out(tmp_dir / file_name);
      out.write(text.data(), text.size());
      out.finish();
      manifest.files.push_back({file_name, out.bytes(), out.crc(), /*text=*/true});
    }
    {
      ChecksummedFile out(tmp_dir / kManifest);
      const std::string text = manifest_text(manifest);
      out.write(text.data(), text.size());
      out.finish();
    }
    fsync_dir(tmp_dir);
    // A checkpoint of this iteration already there (a rewind or a resume saving it again): the two
    // folders are swapped in one atomic step, so no moment exists without an intact iter_N.
    if (fs::exists(final_dir)) {
      if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
        fs::remove_all(tmp_dir, ec);  // now the old folder
      } else {
        // A filesystem without RENAME_EXCHANGE: moved aside first (a kill between the two renames
        // leaves the older checkpoints and the folder aside, which the next run removes).
        const fs::path old = root_ / fmt::format(".{}.old.tmp.{}", name, ::getpid());
        fs::remove_all(old, ec);
        fs::rename(final_dir, old);
        fs::rename(tmp_dir, final_dir);
        fs::remove_all(old, ec);
      }
    } else {
      fs::rename(tmp_dir, final_dir);
    }
    fsync_dir(root_);
    {
      io::AtomicFile tracker(root_ / kTracker);
      tracker.write(std::to_string(content.iteration));
      tracker.commit();
    }
    fsync_dir(root_);
    if (fault_fires(FaultKind::CorruptCheckpoint, save_number)) corrupt_for_fault(final_dir, manifest);
  } catch (const std::exception& e) {
    fs::remove_all(tmp_dir, ec);
    const auto present = iterations();
    KILN_FAIL("saving checkpoint {} failed: {}. {}", final_dir.string(), e.what(),
              present.empty() ? std::string("There is no earlier checkpoint")
                              : fmt::format("The earlier checkpoints are untouched; the newest is {}",
                                            dir_of(present.back()).string()));
  }
  apply_retention(content.iteration);
  return final_dir;
}

void CheckpointStore::apply_retention(std::int64_t newest) {
  if (options_.keep_last <= 0) return;
  std::vector<std::int64_t> present = iterations();
  if (static_cast<int>(present.size()) <= options_.keep_last) return;
  if (auto problem = verify(newest)) {
    fmt::print(stderr, "warning: the checkpoint just written, {}, does not verify ({}); no older one is deleted\n",
               dir_of(newest).string(), *problem);
    return;
  }
  std::sort(present.rbegin(), present.rend());
  std::error_code ec;
  for (std::size_t i = static_cast<std::size_t>(options_.keep_last); i < present.size(); ++i) {
    if (present[i] == newest) continue;
    // Renamed to a temporary name first, so a kill mid-removal leaves no half folder named iter_*.
    const fs::path doomed = root_ / fmt::format(".{}.deleted.tmp.{}", iteration_dir_name(present[i]), ::getpid());
    fs::rename(dir_of(present[i]), doomed, ec);
    if (!ec) fs::remove_all(doomed, ec);
  }
}

std::optional<std::string> CheckpointStore::verify(std::int64_t iteration) const {
  const fs::path dir = dir_of(iteration);
  try {
    const Manifest m = read_manifest(dir);
    KILN_CHECK(m.iteration == iteration, "the manifest says iteration {}", m.iteration);
    return check_files(dir, m);
  } catch (const Error& e) {
    return std::string(e.what());
  }
}

std::optional<LoadedCheckpoint> CheckpointStore::load_newest_intact() {
  passed_over_.clear();
  std::vector<std::int64_t> present = iterations();
  for (auto it = present.rbegin(); it != present.rend(); ++it) {
    const fs::path dir = dir_of(*it);
    std::optional<std::string> problem;
    LoadedCheckpoint c;
    try {
      const Manifest m = read_manifest(dir);
      KILN_CHECK(m.iteration == *it, "the manifest says iteration {}", m.iteration);
      problem = check_files(dir, m);
      if (!problem) {
        c.iteration = m.iteration;
        c.metadata = m.metadata;
        c.dir = dir;
        for (const auto& f : m.files)
          if (!f.text) c.files.emplace_back(f.name, io::load_safetensors((dir / f.name).string()).tensors);
      }
    } catch (const Error& e) {
      problem = e.what();
    }
    if (problem) {
      passed_over_.push_back(fmt::format("{}: {}", iteration_dir_name(*it), *problem));
      continue;
    }
    c.passed_over = passed_over_;
    return c;
  }
  return std::nullopt;
}

}  // namespace kiln::train
