#include "kiln/io/png_writer.h"

#include <csetjmp>

#include "kiln/io/atomic_file.h"
#include "kiln/io/libpng_errors.h"
#include "kiln/runtime/error.h"

namespace kiln::io {

namespace {

struct WriteStructs {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~WriteStructs() { png_destroy_write_struct(&png, info ? &info : nullptr); }
};

// Only trivially destructible locals here: libpng longjmps out of this frame on error.
bool encode(png_structp png, png_infop info, std::FILE* file, const std::uint8_t* pixels, int width, int height,
            int channels) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_init_io(png, file);
  int color_type = channels == 1 ? PNG_COLOR_TYPE_GRAY : channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_RGB_ALPHA;
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8, color_type,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  const png_size_t row_bytes = png_size_t(width) * channels;
  for (int y = 0; y < height; ++y) png_write_row(png, pixels + row_bytes * static_cast<png_size_t>(y));
  png_write_end(png, nullptr);
  return true;
}

}  // namespace

void write_png(const std::filesystem::path& path, const std::uint8_t* pixels, int width, int height, int channels) {
  KILN_CHECK(width > 0 && height > 0, "cannot write PNG '{}': size {}x{} is empty", path.string(), width, height);
  KILN_CHECK(channels == 1 || channels == 3 || channels == 4,
             "cannot write PNG '{}': {} channels (expected 1 gray, 3 RGB or 4 RGBA)", path.string(), channels);
  KILN_CHECK(pixels, "cannot write PNG '{}': no pixels", path.string());
  AtomicFile out(path);
  detail::PngErrorState errors;
  WriteStructs s;
  s.png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, &errors, detail::png_error_to_longjmp, detail::png_ignore_warning);
  KILN_CHECK(s.png, "cannot create a libpng writer for '{}'", path.string());
  s.info = png_create_info_struct(s.png);
  KILN_CHECK(s.info, "cannot create a libpng writer for '{}'", path.string());
  KILN_CHECK(encode(s.png, s.info, out.stream(), pixels, width, height, channels), "cannot encode PNG '{}': {}",
             path.string(), errors.message);
  out.commit();
}

void write_png(const std::filesystem::path& path, const Image& image) {
  KILN_CHECK(image.pixels.size() == std::size_t(image.width) * image.height * image.channels,
             "cannot write PNG '{}': {} bytes of pixels for {}x{}x{}", path.string(), image.pixels.size(), image.width,
             image.height, image.channels);
  write_png(path, image.pixels.data(), image.width, image.height, image.channels);
}

}  // namespace kiln::io
