#pragma once
// GPT-2's byte-level alphabet: every byte value has a printable code point, so that vocabulary
// files can hold arbitrary bytes as text ("Ġ" is the space byte, "Ċ" the newline). Kiln encodes on
// raw bytes and converts vocabulary strings to bytes once, when a tokenizer is loaded.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::data {

// The code point GPT-2's bytes_to_unicode() assigns to byte `b`.
char32_t byte_to_code_point(std::uint8_t b);

// The raw bytes a vocabulary string in the byte-level alphabet stands for; nullopt when it holds a
// character outside the alphabet (or is not valid UTF-8).
std::optional<std::string> byte_level_to_bytes(std::string_view alphabet_text);

// The vocabulary spelling (UTF-8 of the alphabet's code points) of raw bytes.
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace kiln::data
