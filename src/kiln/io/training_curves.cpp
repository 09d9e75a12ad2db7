#include "kiln/io/training_curves.h"

namespace kiln::io {

namespace {

// Colour-blind-safe pair (Okabe-Ito blue and vermillion); validation is also dashed.
LineSeries per_epoch(const std::string& label, const std::vector<double>& values, double scale, bool validation) {
  LineSeries s;
  s.label = label;
  for (std::size_t i = 0; i < values.size(); ++i) {
    s.x.push_back(double(i + 1));
    s.y.push_back(values[i] * scale);
  }
  if (validation) {
    s.red = 0.84, s.green = 0.37, s.blue = 0.0;
    s.dashed = true;
  } else {
    s.red = 0.0, s.green = 0.45, s.blue = 0.70;
  }
  return s;
}

}  // namespace

LineFigure training_curves_figure(const TrainingHistory& history, const std::string& title) {
  LineFigure figure;
  figure.title = title;
  PlotPanel loss{"Loss", "epoch", "cross-entropy loss", {}, std::nullopt, "", true};
  if (!history.train_loss.empty()) loss.series.push_back(per_epoch("train", history.train_loss, 1, false));
  if (!history.val_loss.empty()) loss.series.push_back(per_epoch("validation", history.val_loss, 1, true));
  PlotPanel accuracy{"Accuracy", "epoch", "accuracy", {}, std::nullopt, "%", true};
  if (!history.train_accuracy.empty()) {
    accuracy.series.push_back(per_epoch("train", history.train_accuracy, 100, false));
  }
  if (!history.val_accuracy.empty()) {
    accuracy.series.push_back(per_epoch("validation", history.val_accuracy, 100, true));
  }
  figure.panels = {std::move(loss), std::move(accuracy)};
  return figure;
}

void write_training_curves(const std::filesystem::path& png, const TrainingHistory& history, const std::string& title) {
  write_line_figure(png, training_curves_figure(history, title));
}

}  // namespace kiln::io
