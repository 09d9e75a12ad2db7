#include "kiln/io/image_grid.h"

#include <algorithm>
#include <cmath>

#include "kiln/io/cairo_canvas.h"
#include "kiln/io/png_writer.h"
#include "kiln/runtime/error.h"

namespace kiln::io {

namespace {

using detail::Align;
using detail::CairoCanvas;

constexpr detail::Color kRight{0.13, 0.55, 0.13};
constexpr detail::Color kWrong{0.85, 0.1, 0.1};

std::string class_name(const PredictionGridOptions& options, int label) {
  if (label >= 0 && std::size_t(label) < options.class_names.size()) return options.class_names[std::size_t(label)];
  return std::to_string(label);
}

}  // namespace

PredictionGridLayout prediction_grid_layout(const PredictionGridOptions& options) {
  PredictionGridLayout l;
  l.border = 3;
  const int picture_w = options.width * options.scale, picture_h = options.height * options.scale;
  // Captions need ~150 px ("automobile 100%" at 12 px); small pictures get wider cells.
  l.cell_width = std::max(picture_w + 2 * l.border + 16, 156);
  l.cell_height = picture_h + 2 * l.border + 48;
  l.picture_left = (l.cell_width - picture_w) / 2;
  l.picture_top = 8 + l.border;
  l.header_height = 44;
  return l;
}

Image render_prediction_grid(std::span<const PredictionSample> samples, const PredictionGridOptions& options) {
  KILN_CHECK(!samples.empty(), "prediction grid '{}': no images", options.title);
  KILN_CHECK(options.channels == 1 || options.channels == 3, "prediction grid: {} channels (expected 1 or 3)",
             options.channels);
  KILN_CHECK(options.width > 0 && options.height > 0 && options.scale > 0 && options.columns > 0,
             "prediction grid: bad geometry {}x{} scale {} columns {}", options.width, options.height, options.scale,
             options.columns);
  const auto l = prediction_grid_layout(options);
  const int columns = std::min<int>(options.columns, int(samples.size()));
  const int rows = int((samples.size() + std::size_t(columns) - 1) / std::size_t(columns));
  CairoCanvas canvas(columns * l.cell_width, l.header_height + rows * l.cell_height);
  cairo_t* cr = canvas.cr();

  int right = 0;
  for (const auto& s : samples) right += s.true_label == s.predicted_label;
  canvas.set_color({0.05, 0.05, 0.05});
  const std::string title = (options.title.empty() ? std::string() : options.title + ": ") +
                            fmt::format("{} of {} right", right, samples.size());
  canvas.text(columns * l.cell_width / 2.0, 28, title, 17, Align::Center, true);

  const int pw = options.width * options.scale, ph = options.height * options.scale;
  const std::size_t plane = std::size_t(options.width) * options.height;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    KILN_CHECK(s.image, "prediction grid: image {} is null", i);
    const bool wrong = s.true_label != s.predicted_label;
    const int cx = int(i % std::size_t(columns)) * l.cell_width;
    const int cy = l.header_height + int(i / std::size_t(columns)) * l.cell_height;
    const int x0 = cx + l.picture_left, y0 = cy + l.picture_top;

    // Frame: thick red when wrong, thin green when right.
    canvas.set_color(wrong ? kWrong : kRight);
    const int frame = wrong ? l.border : 1;
    cairo_rectangle(cr, x0 - frame, y0 - frame, pw + 2 * frame, ph + 2 * frame);
    cairo_fill(cr);

    // The picture, enlarged by pixel replication (an image surface drawn with NEAREST filtering
    // would do the same; writing pixels directly keeps it exact).
    cairo_surface_t* surface = cairo_get_target(cr);
    cairo_surface_flush(surface);
    unsigned char* data = cairo_image_surface_get_data(surface);
    const int stride = cairo_image_surface_get_stride(surface);
    for (int y = 0; y < ph; ++y) {
      auto* row = reinterpret_cast<std::uint32_t*>(data + std::size_t(y0 + y) * stride);
      const std::size_t sy = std::size_t(y / options.scale);
      for (int x = 0; x < pw; ++x) {
        const std::size_t p = sy * options.width + std::size_t(x / options.scale);
        const std::uint32_t r = s.image[p];
        const std::uint32_t g = options.channels == 3 ? s.image[plane + p] : r;
        const std::uint32_t b = options.channels == 3 ? s.image[2 * plane + p] : r;
        row[x0 + x] = 0xff000000u | (r << 16) | (g << 8) | b;
      }
    }
    cairo_surface_mark_dirty(surface);

    // Caption: true class, then prediction and confidence.
    const double tx = cx + l.cell_width / 2.0;
    const double ty = y0 + ph + l.border + 17;
    canvas.set_color({0.15, 0.15, 0.15});
    canvas.text(tx, ty, "true: " + class_name(options, s.true_label), 12, Align::Center);
    canvas.set_color(wrong ? kWrong : kRight);
    const int percent = int(std::lround(std::clamp(s.confidence, 0.0f, 1.0f) * 100));
    canvas.text(tx, ty + 17, fmt::format("pred: {} {}%", class_name(options, s.predicted_label), percent), 12,
                Align::Center, wrong);
  }
  return canvas.to_image();
}

void write_prediction_grid(const std::filesystem::path& png, std::span<const PredictionSample> samples,
                           const PredictionGridOptions& options) {
  write_png(png, render_prediction_grid(samples, options));
}

}  // namespace kiln::io
