#include "kiln/io/png_reader.h"

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

#include "kiln/io/file_closer.h"
#include "kiln/io/libpng_errors.h"
#include "kiln/runtime/error.h"

namespace kiln::io {

namespace {

struct ReadStructs {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~ReadStructs() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

// Phase 1: the header, and the transforms that give 8-bit gray / RGB / RGBA. Only trivially
// destructible locals live here, so libpng's longjmp on error skips no destructor.
bool read_header(png_structp png, png_infop info, std::FILE* file, int* width, int* height, int* channels) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_init_io(png, file);
  png_read_info(png, info);
  int color_type = png_get_color_type(png, info);
  int bit_depth = png_get_bit_depth(png, info);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
  if (bit_depth == 16) png_set_strip_16(png);
  if (color_type == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  if (png_get_interlace_type(png, info) != PNG_INTERLACE_NONE) png_set_interlace_handling(png);
  png_read_update_info(png, info);
  *width = static_cast<int>(png_get_image_width(png, info));
  *height = static_cast<int>(png_get_image_height(png, info));
  *channels = png_get_channels(png, info);
  return true;
}

// Phase 2: the pixels, into a buffer the caller sized from phase 1.
bool read_pixels(png_structp png, png_infop info, png_bytep pixels, int height, png_size_t row_bytes, int passes) {
  if (setjmp(png_jmpbuf(png))) return false;
  for (int pass = 0; pass < passes; ++pass) {
    for (int y = 0; y < height; ++y) png_read_row(png, pixels + row_bytes * static_cast<png_size_t>(y), nullptr);
  }
  png_read_end(png, nullptr);
  return true;
}

}  // namespace

Image read_png(const std::filesystem::path& path) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  KILN_CHECK(file, "cannot open PNG file '{}': {}", path.string(), std::strerror(errno));
  unsigned char signature[8] = {};
  KILN_CHECK(std::fread(signature, 1, 8, file.get()) == 8 && png_sig_cmp(signature, 0, 8) == 0,
             "'{}' is not a PNG file (bad signature)", path.string());
  detail::PngErrorState errors;
  ReadStructs s;
  s.png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &errors, detail::png_error_to_longjmp, detail::png_ignore_warning);
  KILN_CHECK(s.png, "cannot create a libpng reader for '{}'", path.string());
  s.info = png_create_info_struct(s.png);
  KILN_CHECK(s.info, "cannot create a libpng reader for '{}'", path.string());
  png_set_sig_bytes(s.png, 8);

  Image image;
  KILN_CHECK(read_header(s.png, s.info, file.get(), &image.width, &image.height, &image.channels),
             "cannot decode PNG '{}': {}", path.string(), errors.message);
  KILN_CHECK(image.width > 0 && image.height > 0 && (image.channels == 1 || image.channels == 3 || image.channels == 4),
             "PNG '{}' has an unsupported layout: {}x{} with {} channels", path.string(), image.width, image.height,
             image.channels);
  png_size_t row_bytes = png_get_rowbytes(s.png, s.info);
  KILN_CHECK(row_bytes == png_size_t(image.width) * image.channels, "PNG '{}': unexpected row size {} bytes",
             path.string(), row_bytes);
  image.pixels.resize(row_bytes * image.height);
  int passes = png_get_interlace_type(s.png, s.info) != PNG_INTERLACE_NONE ? PNG_INTERLACE_ADAM7_PASSES : 1;
  KILN_CHECK(read_pixels(s.png, s.info, image.pixels.data(), image.height, row_bytes, passes),
             "cannot decode PNG '{}': {}", path.string(), errors.message);
  return image;
}

}  // namespace kiln::io
