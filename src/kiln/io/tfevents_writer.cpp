#include "kiln/io/tfevents_writer.h"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <system_error>

#include "kiln/io/crc32c.h"
#include "kiln/runtime/error.h"

namespace kiln::io {

namespace {

// Protobuf wire format: a key is (field number << 3) | wire type; integers are little-endian
// base-128 varints; wire type 0 varint, 1 fixed 64-bit, 2 length-delimited, 5 fixed 32-bit.
void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

template <typename T>
void put_little_endian(std::string& out, T value) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  static_assert(std::endian::native == std::endian::little, "encode byte-swapped on big-endian hosts");
  out.append(reinterpret_cast<const char*>(bytes), sizeof(T));
}

void put_key(std::string& out, int field, int wire_type) { put_varint(out, std::uint64_t(field << 3 | wire_type)); }

void put_bytes_field(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string event_header(double wall_time, std::int64_t step) {
  std::string event;
  put_key(event, 1, 1);
  put_little_endian(event, wall_time);
  if (step != 0) {  // proto3 leaves default values out
    put_key(event, 2, 0);
    put_varint(event, static_cast<std::uint64_t>(step));  // negative int64 is a 10-byte varint
  }
  return event;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == 0) return "localhost";
  return name;
}

}  // namespace

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string tfrecord_frame(std::string_view data) {
  std::string record;
  std::string length;
  put_little_endian(length, static_cast<std::uint64_t>(data.size()));
  record += length;
  put_little_endian(record, mask_crc32c(crc32c(length)));
  record.append(data);
  put_little_endian(record, mask_crc32c(crc32c(data)));
  return record;
}

std::string file_version_event(double wall_time) {
  std::string event = event_header(wall_time, 0);
  put_bytes_field(event, 3, "brain.Event:2");
  return event;
}

std::string scalar_event(std::string_view tag, float value, std::int64_t step, double wall_time) {
  std::string summary_value;
  put_bytes_field(summary_value, 1, tag);
  put_key(summary_value, 2, 5);
  put_little_endian(summary_value, value);
  std::string summary;
  put_bytes_field(summary, 1, summary_value);
  std::string event = event_header(wall_time, step);
  put_bytes_field(event, 5, summary);
  return event;
}

TfEventsWriter::TfEventsWriter(const std::filesystem::path& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  KILN_CHECK(!ec, "cannot create the TensorBoard log folder '{}': {}", log_dir.string(), ec.message());
  const double now = seconds_since_epoch();
  const std::string base = "events.out.tfevents." + std::to_string(static_cast<long long>(now)) + "." + host_name();
  path_ = log_dir / base;
  // Two writers started in the same second (two runs, or a test) must not share a file.
  for (int n = 1; std::filesystem::exists(path_, ec); ++n) {
    path_ = log_dir / (base + "." + std::to_string(::getpid()) + "." + std::to_string(n));
  }
  file_ = std::fopen(path_.c_str(), "wb");
  KILN_CHECK(file_, "cannot create the TensorBoard event file '{}': {}", path_.string(), std::strerror(errno));
  write_record(file_version_event(now));
}

TfEventsWriter::~TfEventsWriter() {
  if (file_) std::fclose(file_);
}

void TfEventsWriter::add_scalar(std::string_view tag, float value, std::int64_t step) {
  add_scalar(tag, value, step, seconds_since_epoch());
}

void TfEventsWriter::add_scalar(std::string_view tag, float value, std::int64_t step, double wall_time) {
  KILN_CHECK(!tag.empty(), "TensorBoard scalar with an empty tag (file '{}')", path_.string());
  write_record(scalar_event(tag, value, step, wall_time));
}

void TfEventsWriter::write_record(std::string_view data) {
  const std::string record = tfrecord_frame(data);
  KILN_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size() && std::fflush(file_) == 0,
             "cannot write to the TensorBoard event file '{}': {}", path_.string(), std::strerror(errno));
}

}  // namespace kiln::io
