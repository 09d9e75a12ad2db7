#pragma once
// CairoCanvas: an RGB drawing surface with text, shared by the plot and image-grid writers.
// Internal to io/: public headers do not include cairo, which is linked privately.
#include <cairo.h>

#include <string_view>

#include "kiln/io/image.h"

namespace kiln::io::detail {

struct Color {
  double r = 0, g = 0, b = 0;
};

enum class Align { Left, Center, Right };

class CairoCanvas {
 public:
  // A white canvas of width x height pixels.
  CairoCanvas(int width, int height);
  ~CairoCanvas();
  CairoCanvas(const CairoCanvas&) = delete;
  CairoCanvas& operator=(const CairoCanvas&) = delete;

  cairo_t* cr() { return cr_; }
  void set_color(Color c) { cairo_set_source_rgb(cr_, c.r, c.g, c.b); }

  // Draws `text` with its baseline at y, aligned at x; returns its width in pixels.
  double text(double x, double y, std::string_view text, double size, Align align = Align::Left, bool bold = false);
  // Same, rotated 90 degrees counter-clockwise, centred on (x, y) (for y-axis labels).
  void vertical_text(double x, double y, std::string_view text, double size);
  double text_width(std::string_view text, double size, bool bold = false);

  // The pixels as 8-bit RGB.
  Image to_image();

 private:
  cairo_surface_t* surface_ = nullptr;
  cairo_t* cr_ = nullptr;
  int width_, height_;
};

}  // namespace kiln::io::detail
