#include "kiln/io/cairo_canvas.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "kiln/runtime/error.h"

namespace kiln::io::detail {

namespace {

// DejaVu Sans (Debian's fonts-dejavu-core) through fontconfig; cairo falls back to any sans face.
void select_font(cairo_t* cr, double size, bool bold) {
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
}

}  // namespace

CairoCanvas::CairoCanvas(int width, int height) : width_(width), height_(height) {
  KILN_CHECK(width > 0 && height > 0 && width <= 32768 && height <= 32768, "canvas size {}x{} is out of range", width,
             height);
  surface_ = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, width, height);
  KILN_CHECK(cairo_surface_status(surface_) == CAIRO_STATUS_SUCCESS, "cairo cannot create a {}x{} surface: {}", width,
             height, cairo_status_to_string(cairo_surface_status(surface_)));
  cr_ = cairo_create(surface_);
  cairo_set_source_rgb(cr_, 1, 1, 1);
  cairo_paint(cr_);
}

CairoCanvas::~CairoCanvas() {
  cairo_destroy(cr_);
  cairo_surface_destroy(surface_);
}

double CairoCanvas::text_width(std::string_view text, double size, bool bold) {
  select_font(cr_, size, bold);
  const std::string s(text);
  cairo_text_extents_t extents;
  cairo_text_extents(cr_, s.c_str(), &extents);
  return extents.x_advance;
}

double CairoCanvas::text(double x, double y, std::string_view text, double size, Align align, bool bold) {
  const double width = text_width(text, size, bold);
  const double left = align == Align::Left ? x : align == Align::Center ? x - width / 2 : x - width;
  const std::string s(text);
  cairo_move_to(cr_, left, y);
  cairo_show_text(cr_, s.c_str());
  return width;
}

void CairoCanvas::vertical_text(double x, double y, std::string_view text, double size) {
  const double width = text_width(text, size);
  cairo_save(cr_);
  cairo_translate(cr_, x, y);
  cairo_rotate(cr_, -M_PI / 2);
  const std::string s(text);
  cairo_move_to(cr_, -width / 2, 0);
  cairo_show_text(cr_, s.c_str());
  cairo_restore(cr_);
}

Image CairoCanvas::to_image() {
  cairo_surface_flush(surface_);
  KILN_CHECK(cairo_status(cr_) == CAIRO_STATUS_SUCCESS, "cairo drawing failed: {}",
             cairo_status_to_string(cairo_status(cr_)));
  Image image(width_, height_, 3);
  const unsigned char* data = cairo_image_surface_get_data(surface_);
  const int stride = cairo_image_surface_get_stride(surface_);
  for (int y = 0; y < height_; ++y) {
    // ARGB32 is a native-endian 32-bit word per pixel; the canvas is opaque, so no un-premultiplying.
    const auto* row = reinterpret_cast<const std::uint32_t*>(data + std::size_t(y) * stride);
    for (int x = 0; x < width_; ++x) {
      std::uint8_t* out = image.at(x, y);
      out[0] = static_cast<std::uint8_t>(row[x] >> 16);
      out[1] = static_cast<std::uint8_t>(row[x] >> 8);
      out[2] = static_cast<std::uint8_t>(row[x]);
    }
  }
  return image;
}

}  // namespace kiln::io::detail
