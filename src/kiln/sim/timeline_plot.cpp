#include "kiln/sim/timeline_plot.h"

#include <fmt/format.h>

#include <algorithm>

#include "kiln/io/cairo_canvas.h"
#include "kiln/io/png_writer.h"
#include "kiln/runtime/error.h"

namespace kiln::sim {

void write_timeline_png(const ScheduleResult& schedule, int devices, const std::string& title,
                        const std::filesystem::path& path) {
  KILN_CHECK(devices >= 1 && schedule.makespan > 0, "--timeline: nothing to draw (an empty schedule)");
  using io::detail::Align;
  using io::detail::Color;
  const int row = 28, left = 90, right = 30, top = 50, bottom = 50;
  const int width = 1400, height = top + bottom + row * devices;
  io::detail::CairoCanvas canvas(width, height);
  cairo_t* cr = canvas.cr();
  const double scale = (width - left - right) / schedule.makespan;
  canvas.set_color({0, 0, 0});
  canvas.text(width / 2.0, 28, title, 16, Align::Center, true);
  for (int dvc = 0; dvc < devices; ++dvc)
    canvas.text(left - 8, top + row * dvc + row * 0.65, fmt::format("device {}", dvc), 12, Align::Right);
  for (const Pass& p : schedule.passes) {
    Color c = p.kind == PassKind::F   ? Color{0.27, 0.51, 0.71}
              : p.kind == PassKind::B ? Color{0.93, 0.55, 0.2}
                                      : Color{0.35, 0.7, 0.4};
    if (p.chunk % 2 == 1 || p.direction == 1) c = {c.r * 0.7, c.g * 0.7, c.b * 0.7};  // second chunk, darker
    const double x = left + p.start * scale, w = std::max(1.0, (p.end - p.start) * scale);
    const double y = top + row * p.device + 2;
    canvas.set_color(c);
    cairo_rectangle(cr, x, y, w, row - 4);
    cairo_fill(cr);
    canvas.set_color({1, 1, 1});
    cairo_set_line_width(cr, 0.5);
    cairo_rectangle(cr, x, y, w, row - 4);
    cairo_stroke(cr);
    const std::string label = std::to_string(p.micro_batch);
    if (canvas.text_width(label, 10) < w - 2) canvas.text(x + w / 2, y + row * 0.55, label, 10, Align::Center);
  }
  canvas.set_color({0, 0, 0});
  canvas.text(left, height - 18,
              fmt::format("step {:.4g} s, bubble {:.1f}%  (F blue, B orange, W green; darker: second chunk or "
                          "direction)",
                          schedule.makespan, 100 * schedule.bubble_fraction),
              12);
  io::write_png(path, canvas.to_image());
}

}  // namespace kiln::sim
