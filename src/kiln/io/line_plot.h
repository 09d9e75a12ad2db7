#pragma once
// Line plots drawn with cairo into a PNG: a figure of side-by-side panels, each with axes, "nice"
// ticks (1, 2, 5 x 10^k), axis labels, a legend placed where it hides the fewest points, and
// one line per series. Non-finite points (a missing validation epoch) are skipped.
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/io/image.h"

namespace kiln::io {

struct LineSeries {
  std::string label;
  std::vector<double> x;
  std::vector<double> y;
  double red = 0, green = 0, blue = 0;  // 0..1
  bool dashed = false;
  bool markers = true;  // a dot at each point
};

struct PlotPanel {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<LineSeries> series;
  std::optional<std::pair<double, double>> y_range;  // fixed (min, max); automatic when empty
  std::string y_suffix;                              // appended to y tick labels, e.g. "%"
  bool integer_x = false;                            // x ticks only at whole numbers (epochs)
};

struct LineFigure {
  std::string title;
  std::vector<PlotPanel> panels;
  int panel_width = 600;
  int panel_height = 440;
};

Image render_line_figure(const LineFigure& figure);
void write_line_figure(const std::filesystem::path& png, const LineFigure& figure);

// Tick positions covering [lo, hi] with about `target` steps of 1, 2 or 5 x 10^k.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

}  // namespace kiln::io
