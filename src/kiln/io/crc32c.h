#pragma once
// CRC-32C (Castagnoli polynomial, reflected 0x82F63B78), as TFRecord framing needs it, and the
// "masked" form TFRecord stores so that a CRC of data containing CRCs stays well distributed.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln::io {

// CRC-32C of `bytes`, continuing from `crc` (0 to start): crc32c("123456789") == 0xE3069283.
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0);
inline std::uint32_t crc32c(std::string_view bytes) { return crc32c(bytes.data(), bytes.size()); }

// TFRecord's mask: rotate right by 15 bits and add a constant.
inline constexpr std::uint32_t mask_crc32c(std::uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace kiln::io
