#pragma once
// Decodes a PNG file with libpng into 8-bit pixels, exactly as stored (no gamma or colour
// management): palette images become RGB (RGBA with transparency), 16-bit samples are reduced to
// 8 bits, gray stays gray (1 channel) and gray+alpha becomes RGBA.
#include <filesystem>

#include "kiln/io/image.h"

namespace kiln::io {

// Throws kiln::Error naming the file when it is missing or not a valid PNG.
Image read_png(const std::filesystem::path& path);

}  // namespace kiln::io
