#pragma once
// TfEventsWriter: TensorBoard event files (`events.out.tfevents.<time>.<host>`), scalars only.
// The file is a TFRecord stream: each record is uint64 length, uint32 masked CRC-32C of the
// length, the data, uint32 masked CRC-32C of the data (little-endian). Each record's data is a
// tensorflow.Event protobuf, encoded here by hand (no protobuf dependency for three fields):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// The first record is the file_version event "brain.Event:2", as TensorFlow 2 writes.
// Event files grow while training runs (TensorBoard reads them live), so they are appended to
// and flushed per scalar rather than written atomically.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

namespace kiln::io {

class TfEventsWriter {
 public:
  // Creates `log_dir` if needed and a new event file in it.
  explicit TfEventsWriter(const std::filesystem::path& log_dir);
  ~TfEventsWriter();
  TfEventsWriter(const TfEventsWriter&) = delete;
  TfEventsWriter& operator=(const TfEventsWriter&) = delete;

  // One scalar (TensorBoard's "Scalars" tab: tag, x = step, y = value), stamped with the time now.
  void add_scalar(std::string_view tag, float value, std::int64_t step);
  void add_scalar(std::string_view tag, float value, std::int64_t step, double wall_time);

  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(std::string_view data);

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

// The pieces, for tests and for anyone writing other record files.
std::string tfrecord_frame(std::string_view data);
std::string file_version_event(double wall_time);
std::string scalar_event(std::string_view tag, float value, std::int64_t step, double wall_time);
double seconds_since_epoch();

}  // namespace kiln::io
