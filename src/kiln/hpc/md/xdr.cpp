#include "kiln/hpc/md/xdr.h"

#include <bit>

#include "kiln/runtime/error.h"

namespace kiln::md {

void XdrWriter::put_u32(std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) bytes_.push_back(static_cast<char>((v >> shift) & 0xff));
}

void XdrWriter::put_float(float v) { put_u32(std::bit_cast<std::uint32_t>(v)); }

void XdrWriter::put_double(double v) {
  const auto bits = std::bit_cast<std::uint64_t>(v);
  put_u32(static_cast<std::uint32_t>(bits >> 32));
  put_u32(static_cast<std::uint32_t>(bits));
}

void XdrWriter::put_opaque(std::string_view bytes) {
  bytes_.append(bytes);
  bytes_.append((4 - bytes.size() % 4) % 4, '\0');
}

std::string_view XdrReader::take(std::size_t n) {
  KILN_CHECK(n <= remaining(), "{}: truncated at byte {}: {} more bytes expected, {} left", name_, offset_, n,
             remaining());
  auto out = bytes_.substr(offset_, n);
  offset_ += n;
  return out;
}

std::uint32_t XdrReader::get_u32() {
  auto b = take(4);
  std::uint32_t v = 0;
  for (char c : b) v = (v << 8) | static_cast<unsigned char>(c);
  return v;
}

float XdrReader::get_float() { return std::bit_cast<float>(get_u32()); }

double XdrReader::get_double() {
  const std::uint64_t high = get_u32();
  return std::bit_cast<double>((high << 32) | get_u32());
}

std::string_view XdrReader::get_opaque(std::size_t size) {
  auto out = take(size);
  take((4 - size % 4) % 4);
  return out;
}

}  // namespace kiln::md
