#include "kiln/data/byte_level.h"

#include <array>

namespace kiln::data {

namespace {

// bytes_to_unicode(): the printable Latin-1 bytes map to themselves; the other 68 bytes, in order,
// to 256, 257, ... so that no byte maps to whitespace or a control character.
constexpr std::array<char32_t, 256> make_byte_to_code_point() {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

constexpr std::array<char32_t, 256> kByteToCodePoint = make_byte_to_code_point();

// The inverse, over the code points 0..323 the alphabet uses; -1 where none maps.
constexpr std::array<int, 324> make_code_point_to_byte() {
  std::array<int, 324> table{};
  for (auto& v : table) v = -1;
  for (int b = 0; b < 256; ++b) table[kByteToCodePoint[b]] = b;
  return table;
}

constexpr std::array<int, 324> kCodePointToByte = make_code_point_to_byte();

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    // The alphabet stays below U+0800: two bytes suffice.
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

char32_t byte_to_code_point(std::uint8_t b) { return kByteToCodePoint[b]; }

std::optional<std::string> byte_level_to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    auto c0 = static_cast<unsigned char>(text[i]);
    char32_t cp;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80) {
      cp = (static_cast<char32_t>(c0 & 0x1F) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3F);
      i += 2;
    } else {
      return std::nullopt;  // three- and four-byte characters are outside the alphabet
    }
    if (cp >= kCodePointToByte.size() || kCodePointToByte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(kCodePointToByte[cp]));
  }
  return out;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, kByteToCodePoint[static_cast<unsigned char>(c)]);
  return out;
}

}  // namespace kiln::data
