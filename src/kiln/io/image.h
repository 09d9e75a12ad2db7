#pragma once
// Image: 8-bit pixels, interleaved (height x width x channels, row-major), as PNG stores them.
// Channels is 1 (gray), 3 (RGB) or 4 (RGBA).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::io {

struct Image {
  int width = 0;
  int height = 0;
  int channels = 0;
  std::vector<std::uint8_t> pixels;

  Image() = default;
  Image(int w, int h, int c) : width(w), height(h), channels(c), pixels(std::size_t(w) * h * c, 0) {}

  std::uint8_t* at(int x, int y) { return pixels.data() + (std::size_t(y) * width + x) * channels; }
  const std::uint8_t* at(int x, int y) const { return pixels.data() + (std::size_t(y) * width + x) * channels; }
};

}  // namespace kiln::io
