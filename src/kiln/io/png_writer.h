#pragma once
// Encodes 8-bit gray, RGB or RGBA pixels as a PNG file with libpng, written atomically.
#include <cstdint>
#include <filesystem>

#include "kiln/io/image.h"

namespace kiln::io {

// `pixels` is height x width x channels, interleaved, row-major; channels is 1, 3 or 4.
void write_png(const std::filesystem::path& path, const std::uint8_t* pixels, int width, int height, int channels);
void write_png(const std::filesystem::path& path, const Image& image);

}  // namespace kiln::io
