#include "kiln/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "kiln/ops/copy.h"

namespace kiln::io {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
// The largest element or byte count a shape may describe (Kiln's sizes are int64).
constexpr std::uint64_t kMaxCount = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kNames[] = {{DType::F64, "F64"},  {DType::F32, "F32"},        {DType::BF16, "BF16"},
                                {DType::F16, "F16"},  {DType::F8E4M3, "F8_E4M3"}, {DType::F8E5M2, "F8_E5M2"},
                                {DType::I64, "I64"},  {DType::I32, "I32"},        {DType::U8, "U8"},
                                {DType::Bool, "BOOL"}};

std::string errno_text() { return std::strerror(errno); }

// Writes all of `size` bytes or throws.
void write_all(int fd, const void* data, std::size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    KILN_CHECK(n > 0, "save_safetensors: writing {} failed: {}", path, errno_text());
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  for (const auto& n : kNames)
    if (n.dtype == dtype) return n.name;
  KILN_FAIL("safetensors: dtype {} has no safetensors name", dtype_name(dtype));
}

DType parse_safetensors_dtype(std::string_view name) {
  for (const auto& n : kNames)
    if (name == n.name) return n.dtype;
  KILN_FAIL("safetensors: unknown dtype \"{}\"", name);
}

void write_safetensors(const TensorDict& tensors, const Metadata& metadata, const ByteSink& sink) {
  // Host, contiguous copies (no-ops for contiguous CPU tensors).
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(t.defined(), "safetensors: tensor '{}' is undefined", name);
    KILN_CHECK(name != "__metadata__", "safetensors: '__metadata__' is reserved");
    Tensor h = ops::contiguous(ops::to(t.detach(), Device::cpu(), t.dtype()));
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = std::string(safetensors_dtype_name(t.dtype()));
    entry["shape"] = t.shape();
    entry["data_offsets"] = {offset, offset + h.nbytes()};
    header[name] = entry;
    offset += h.nbytes();
    host.push_back(std::move(h));
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  const std::uint64_t header_len = json.size();
  sink(&header_len, 8);
  sink(json.data(), json.size());
  for (const Tensor& h : host)
    if (h.nbytes() > 0) sink(h.data_ptr(), h.nbytes());
}

void save_safetensors(const std::string& path, const TensorDict& tensors, const Metadata& metadata) {
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(t.defined(), "save_safetensors({}): tensor '{}' is undefined", path, name);
    KILN_CHECK(name != "__metadata__", "save_safetensors({}): '__metadata__' is reserved", path);
  }
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string tmp = (dir / fmt::format(".{}.tmp.{}", target.filename().string(), ::getpid())).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KILN_CHECK(fd >= 0, "save_safetensors: cannot create {}: {}", tmp, errno_text());
  try {
    write_safetensors(tensors, metadata, [&](const void* data, std::size_t bytes) { write_all(fd, data, bytes, tmp); });
    KILN_CHECK(::fsync(fd) == 0, "save_safetensors: fsync of {} failed: {}", tmp, errno_text());
    KILN_CHECK(::close(fd) == 0, "save_safetensors: closing {} failed: {}", tmp, errno_text());
    fd = -1;
    KILN_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "save_safetensors: renaming {} to {} failed: {}", tmp, path,
               errno_text());
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename durable.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

SafetensorsFile load_safetensors(const std::string& path, Device device) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "load_safetensors: cannot open {}: {}", path, errno_text());
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  KILN_CHECK(file_size >= 8, "load_safetensors: {} is truncated: {} bytes, fewer than the 8-byte header length", path,
             file_size);
  std::uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  KILN_CHECK(header_len <= kMaxHeaderBytes, "load_safetensors: {}: header length {} exceeds the {}-byte limit", path,
             header_len, kMaxHeaderBytes);
  KILN_CHECK(8 + header_len <= file_size,
             "load_safetensors: {} is truncated or corrupt: the header length {} reaches beyond the file ({} bytes)",
             path, header_len, file_size);
  std::string json(header_len, '\0');
  in.read(json.data(), static_cast<std::streamsize>(header_len));
  KILN_CHECK(in.good(), "load_safetensors: reading the header of {} failed", path);
  const std::uint64_t data_start = 8 + header_len, data_size = file_size - data_start;

  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(json);
  } catch (const std::exception& e) {
    KILN_FAIL("load_safetensors: {}: the header is not valid JSON: {}", path, e.what());
  }
  KILN_CHECK(header.is_object(), "load_safetensors: {}: the header is not a JSON object", path);

  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::uint64_t begin, end;
  };
  std::vector<Entry> entries;
  SafetensorsFile out;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      KILN_CHECK(value.is_object(), "load_safetensors: {}: __metadata__ is not an object", path);
      for (const auto& [k, v] : value.items()) {
        KILN_CHECK(v.is_string(), "load_safetensors: {}: metadata value of '{}' is not a string", path, k);
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    KILN_CHECK(
        value.is_object() && value.contains("dtype") && value.contains("shape") && value.contains("data_offsets"),
        "load_safetensors: {}: entry '{}' needs dtype, shape and data_offsets", path, name);
    const auto& jd = value["dtype"];
    KILN_CHECK(jd.is_string(), "load_safetensors: {}: tensor '{}': dtype is not a string", path, name);
    Entry e;
    e.name = name;
    try {
      e.dtype = parse_safetensors_dtype(jd.get<std::string>());
    } catch (const Error&) {
      KILN_FAIL("load_safetensors: {}: tensor '{}' has unknown dtype \"{}\"", path, name, jd.get<std::string>());
    }
    const auto& js = value["shape"];
    KILN_CHECK(js.is_array(), "load_safetensors: {}: tensor '{}': shape is not an array", path, name);
    // The element and byte counts in checked arithmetic: a crafted shape must not wrap around to a
    // small number that happens to match the offsets (numel_of would overflow silently).
    std::uint64_t elements = 1, expected = 0;
    bool overflow = false;
    for (const auto& d : js) {
      KILN_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<std::int64_t>() >= 0),
                 "load_safetensors: {}: tensor '{}': shape {} has a negative or non-integer size", path, name,
                 js.dump());
      const auto size = d.get<std::uint64_t>();
      overflow = overflow || size > kMaxCount || __builtin_mul_overflow(elements, size, &elements);
      e.shape.push_back(static_cast<std::int64_t>(std::min(size, kMaxCount)));
    }
    overflow = overflow || elements > kMaxCount || __builtin_mul_overflow(elements, dtype_size(e.dtype), &expected);
    KILN_CHECK(!overflow,
               "load_safetensors: {}: tensor '{}': shape {} of {} holds more elements or bytes than 2^63: the header "
               "is corrupt",
               path, name, js.dump(), jd.get<std::string>());
    const auto& jo = value["data_offsets"];
    KILN_CHECK(jo.is_array() && jo.size() == 2 && jo[0].is_number_unsigned() && jo[1].is_number_unsigned(),
               "load_safetensors: {}: tensor '{}': data_offsets {} is not a pair of non-negative integers", path, name,
               jo.dump());
    e.begin = jo[0].get<std::uint64_t>();
    e.end = jo[1].get<std::uint64_t>();
    KILN_CHECK(e.begin <= e.end, "load_safetensors: {}: tensor '{}': data_offsets [{}, {}] are reversed", path, name,
               e.begin, e.end);
    KILN_CHECK(e.end <= data_size,
               "load_safetensors: {} is truncated or corrupt: tensor '{}' data_offsets [{}, {}] reach beyond the "
               "{} data bytes",
               path, name, e.begin, e.end, data_size);
    KILN_CHECK(e.end - e.begin == expected,
               "load_safetensors: {}: tensor '{}' ({} {}) needs {} bytes but data_offsets [{}, {}] span {}", path, name,
               jd.get<std::string>(), shape_str(e.shape), expected, e.begin, e.end, e.end - e.begin);
    entries.push_back(std::move(e));
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  const Entry* prev = nullptr;  // the non-empty entry reaching furthest so far
  for (const Entry& e : entries) {
    if (e.begin == e.end) continue;
    KILN_CHECK(!prev || e.begin >= prev->end,
               "load_safetensors: {} is corrupt: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", path, prev->name,
               prev->begin, prev->end, e.name, e.begin, e.end);
    if (!prev || e.end > prev->end) prev = &e;
  }
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype, Device::cpu());
    if (e.end > e.begin) {
      in.seekg(static_cast<std::streamoff>(data_start + e.begin));
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
      KILN_CHECK(in.good(), "load_safetensors: reading tensor '{}' from {} failed", e.name, path);
    }
    out.tensors.insert(e.name, device.is_cpu() ? t : ops::to(t, device, t.dtype()));
  }
  return out;
}

}  // namespace kiln::io
