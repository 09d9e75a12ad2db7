#pragma once
// XDR (RFC 4506), the big-endian encoding of GROMACS's trajectory files (.xtc, .trr): 4-byte
// integers and IEEE floats, opaque bytes padded to a multiple of 4. The reader checks every read
// against the end of its buffer and names the file and byte offset when one runs past it.
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::md {

class XdrWriter {
 public:
  void put_int(std::int32_t v) { put_u32(static_cast<std::uint32_t>(v)); }
  void put_u32(std::uint32_t v);
  void put_float(float v);
  void put_double(double v);
  void put_opaque(std::string_view bytes);  // padded with zeros to a multiple of 4
  const std::string& bytes() const { return bytes_; }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class XdrReader {
 public:
  XdrReader(std::string_view bytes, std::string name) : bytes_(bytes), name_(std::move(name)) {}
  std::int32_t get_int() { return static_cast<std::int32_t>(get_u32()); }
  std::uint32_t get_u32();
  float get_float();
  double get_double();
  std::string_view get_opaque(std::size_t size);  // skips the padding too
  std::size_t offset() const { return offset_; }
  bool at_end() const { return offset_ == bytes_.size(); }
  std::size_t remaining() const { return bytes_.size() - offset_; }
  const std::string& name() const { return name_; }

 private:
  std::string_view take(std::size_t n);
  std::string_view bytes_;
  std::string name_;
  std::size_t offset_ = 0;
};

}  // namespace kiln::md
