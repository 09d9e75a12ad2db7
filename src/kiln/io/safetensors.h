#pragma once
// Safetensors (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON header, then the tensors' bytes back to back (little-endian, C
// order). The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the end of the header) plus an optional "__metadata__" string map.
// Kiln pads the header with spaces to a multiple of 8 bytes and writes tensors in the order
// given, with no gaps, as the reference implementation requires.
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "kiln/tensor/ordered_dict.h"

namespace kiln::io {

using Metadata = std::map<std::string, std::string>;

struct SafetensorsFile {
  TensorDict tensors;  // contiguous CPU tensors, in data-offset order
  Metadata metadata;
};

// Writes atomically: a temporary file next to `path` is written, fsync'ed and renamed over
// `path` (and the directory fsync'ed), so readers see the old file or the complete new one.
// Tensors on other devices are copied to the host; non-contiguous ones are compacted.
void save_safetensors(const std::string& path, const TensorDict& tensors, const Metadata& metadata = {});
// The bytes of a safetensors file of `tensors`, handed to `sink` in order (header length, header,
// then each tensor's bytes), so a caller can write them its own way (checksummed, into a folder it
// renames, with its own error handling). Tensors that are not contiguous CPU tensors are copied.
using ByteSink = std::function<void(const void* data, std::size_t bytes)>;
void write_safetensors(const TensorDict& tensors, const Metadata& metadata, const ByteSink& sink);

// Reads and validates every entry; errors name the file and what is wrong (header length beyond
// the file, malformed JSON, unknown dtype, offsets out of range, overlapping, or not matching
// the shape).
SafetensorsFile load_safetensors(const std::string& path, Device device = Device::cpu());

// "F32", "BF16", ... and back (parse raises on an unknown name).
std::string_view safetensors_dtype_name(DType dtype);
DType parse_safetensors_dtype(std::string_view name);

}  // namespace kiln::io
