#include "kiln/io/line_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/io/cairo_canvas.h"
#include "kiln/io/png_writer.h"
#include "kiln/runtime/error.h"

namespace kiln::io {

namespace {

using detail::Align;
using detail::CairoCanvas;
using detail::Color;

constexpr double kTitleHeight = 44;  // figure title band

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return !(lo <= hi); }
};

double nice_step(double span, int target) {
  const double raw = span / std::max(1, target);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / magnitude;
  return (fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10) * magnitude;
}

// Widens [lo, hi] to whole ticks (and a non-empty span).
Range nice_range(Range r, int target) {
  if (r.empty()) return {0, 1};
  if (r.hi - r.lo < 1e-12 * std::max(1.0, std::abs(r.hi))) {
    const double pad = std::max(std::abs(r.hi) * 0.05, 1e-3);
    r.lo -= pad;
    r.hi += pad;
  }
  const double step = nice_step(r.hi - r.lo, target);
  return {std::floor(r.lo / step + 1e-9) * step, std::ceil(r.hi / step - 1e-9) * step};
}

std::string tick_label(double value, double step, const std::string& suffix) {
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  if (std::abs(value) < step * 1e-6) value = 0;  // no "-0.0"
  return fmt::format("{:.{}f}{}", value, decimals, suffix);
}

void draw_panel(CairoCanvas& canvas, const PlotPanel& panel, double left, double top, double width, double height) {
  cairo_t* cr = canvas.cr();
  // Plot area inside the panel: room for the title, tick labels and axis labels.
  const double px = left + 78, py = top + 36, pw = width - 78 - 24, ph = height - 36 - 62;

  Range xr, yr;
  for (const auto& s : panel.series) {
    KILN_CHECK(s.x.size() == s.y.size(), "plot '{}': series '{}' has {} x and {} y values", panel.title, s.label,
               s.x.size(), s.y.size());
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
        xr.add(s.x[i]);
        yr.add(s.y[i]);
      }
    }
  }
  if (panel.y_range) yr = {panel.y_range->first, panel.y_range->second};
  // Ticks come from the nice range; the axes extend 3% beyond it so points on the edge stay whole.
  const Range x_ticks = nice_range(xr, 8);
  const Range y_ticks = panel.y_range ? yr : nice_range(yr, 6);
  const double x_margin = 0.03 * (x_ticks.hi - x_ticks.lo), y_margin = 0.03 * (y_ticks.hi - y_ticks.lo);
  const Range xn{x_ticks.lo - x_margin, x_ticks.hi + x_margin};
  const Range yn{y_ticks.lo - y_margin, y_ticks.hi + y_margin};
  auto to_x = [&](double v) { return px + (v - xn.lo) / (xn.hi - xn.lo) * pw; };
  auto to_y = [&](double v) { return py + ph - (v - yn.lo) / (yn.hi - yn.lo) * ph; };

  // Title.
  canvas.set_color({0.1, 0.1, 0.1});
  canvas.text(px + pw / 2, top + 22, panel.title, 15, Align::Center, true);

  // Grid and ticks.
  cairo_set_line_width(cr, 1);
  auto xticks = nice_ticks(x_ticks.lo, x_ticks.hi, 8);
  if (panel.integer_x) {
    std::erase_if(xticks, [](double t) { return std::abs(t - std::round(t)) > 1e-9; });
  }
  const double xstep = xticks.size() > 1 ? xticks[1] - xticks[0] : 1;
  for (double t : xticks) {
    const double x = std::round(to_x(t)) + 0.5;
    canvas.set_color({0.9, 0.9, 0.9});
    cairo_move_to(cr, x, py);
    cairo_line_to(cr, x, py + ph);
    cairo_stroke(cr);
    canvas.set_color({0.2, 0.2, 0.2});
    cairo_move_to(cr, x, py + ph);
    cairo_line_to(cr, x, py + ph + 5);
    cairo_stroke(cr);
    canvas.text(x, py + ph + 20, tick_label(t, xstep, ""), 12, Align::Center);
  }
  const auto yticks = nice_ticks(y_ticks.lo, y_ticks.hi, 6);
  const double ystep = yticks.size() > 1 ? yticks[1] - yticks[0] : 1;
  for (double t : yticks) {
    const double y = std::round(to_y(t)) + 0.5;
    canvas.set_color({0.9, 0.9, 0.9});
    cairo_move_to(cr, px, y);
    cairo_line_to(cr, px + pw, y);
    cairo_stroke(cr);
    canvas.set_color({0.2, 0.2, 0.2});
    cairo_move_to(cr, px - 5, y);
    cairo_line_to(cr, px, y);
    cairo_stroke(cr);
    canvas.text(px - 8, y + 4, tick_label(t, ystep, panel.y_suffix), 12, Align::Right);
  }
  // Frame and axis labels.
  canvas.set_color({0.2, 0.2, 0.2});
  cairo_rectangle(cr, std::round(px) + 0.5, std::round(py) + 0.5, std::round(pw), std::round(ph));
  cairo_stroke(cr);
  canvas.text(px + pw / 2, py + ph + 44, panel.x_label, 13, Align::Center);
  canvas.vertical_text(left + 20, py + ph / 2, panel.y_label, 13);

  // Lines, clipped to the plot area.
  cairo_save(cr);
  cairo_rectangle(cr, px, py, pw, ph);
  cairo_clip(cr);
  for (const auto& s : panel.series) {
    cairo_set_source_rgb(cr, s.red, s.green, s.blue);
    cairo_set_line_width(cr, 2.2);
    const double dash[] = {7, 4};
    cairo_set_dash(cr, dash, s.dashed ? 2 : 0, 0);
    bool pen_down = false;
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
        pen_down = false;
        continue;
      }
      if (pen_down) {
        cairo_line_to(cr, to_x(s.x[i]), to_y(s.y[i]));
      } else {
        cairo_move_to(cr, to_x(s.x[i]), to_y(s.y[i]));
      }
      pen_down = true;
    }
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    if (s.markers && s.x.size() <= 200) {
      for (std::size_t i = 0; i < s.x.size(); ++i) {
        if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
        cairo_arc(cr, to_x(s.x[i]), to_y(s.y[i]), 3.2, 0, 2 * M_PI);
        cairo_fill(cr);
      }
    }
  }
  cairo_restore(cr);

  // Legend in the corner that covers the fewest points.
  if (panel.series.empty()) return;
  double legend_w = 0;
  for (const auto& s : panel.series) legend_w = std::max(legend_w, canvas.text_width(s.label, 12));
  legend_w += 52;
  const double legend_h = 10 + 20 * double(panel.series.size());
  const double margin = 10;
  const double corners[4][2] = {{px + pw - legend_w - margin, py + margin},
                                {px + pw - legend_w - margin, py + ph - legend_h - margin},
                                {px + margin, py + margin},
                                {px + margin, py + ph - legend_h - margin}};
  int best = 0;
  long best_hidden = std::numeric_limits<long>::max();
  for (int c = 0; c < 4; ++c) {
    long hidden = 0;
    for (const auto& s : panel.series) {
      for (std::size_t i = 0; i < s.x.size(); ++i) {
        const double x = to_x(s.x[i]), y = to_y(s.y[i]);
        hidden += x >= corners[c][0] - 4 && x <= corners[c][0] + legend_w + 4 && y >= corners[c][1] - 4 &&
                  y <= corners[c][1] + legend_h + 4;
      }
    }
    if (hidden < best_hidden) {
      best_hidden = hidden;
      best = c;
    }
  }
  const double lx = corners[best][0], ly = corners[best][1];
  cairo_set_source_rgba(cr, 1, 1, 1, 0.9);
  cairo_rectangle(cr, lx, ly, legend_w, legend_h);
  cairo_fill_preserve(cr);
  cairo_set_source_rgb(cr, 0.75, 0.75, 0.75);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  for (std::size_t i = 0; i < panel.series.size(); ++i) {
    const auto& s = panel.series[i];
    const double y = ly + 15 + 20 * double(i);
    cairo_set_source_rgb(cr, s.red, s.green, s.blue);
    cairo_set_line_width(cr, 2.2);
    const double dash[] = {7, 4};
    cairo_set_dash(cr, dash, s.dashed ? 2 : 0, 0);
    cairo_move_to(cr, lx + 8, y);
    cairo_line_to(cr, lx + 38, y);
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    canvas.set_color({0.1, 0.1, 0.1});
    canvas.text(lx + 44, y + 4, s.label, 12);
  }
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  KILN_CHECK(std::isfinite(lo) && std::isfinite(hi) && hi > lo, "nice_ticks: bad range [{}, {}]", lo, hi);
  const double step = nice_step(hi - lo, target);
  std::vector<double> ticks;
  // Whole multiples of the step (not a running sum, which drifts).
  for (auto k = static_cast<long long>(std::ceil(lo / step - 1e-9)); double(k) * step <= hi + step * 1e-9; ++k) {
    ticks.push_back(double(k) * step);
  }
  return ticks;
}

Image render_line_figure(const LineFigure& figure) {
  KILN_CHECK(!figure.panels.empty(), "line figure '{}' has no panels", figure.title);
  const int width = figure.panel_width * int(figure.panels.size());
  const int height = figure.panel_height + int(kTitleHeight);
  CairoCanvas canvas(width, height);
  canvas.set_color({0.05, 0.05, 0.05});
  canvas.text(width / 2.0, 30, figure.title, 19, Align::Center, true);
  for (std::size_t i = 0; i < figure.panels.size(); ++i) {
    draw_panel(canvas, figure.panels[i], double(i) * figure.panel_width, kTitleHeight, figure.panel_width,
               figure.panel_height);
  }
  return canvas.to_image();
}

void write_line_figure(const std::filesystem::path& png, const LineFigure& figure) {
  write_png(png, render_line_figure(figure));
}

}  // namespace kiln::io
