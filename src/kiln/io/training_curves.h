#pragma once
// training_curves.png: loss (left) and accuracy (right) per epoch, training and validation.
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/io/line_plot.h"

namespace kiln::io {

// Per-epoch metrics, epoch 1 first. Accuracies are fractions in [0, 1] (plotted as percent).
// Validation vectors may be shorter or hold NaN for epochs without a validation pass.
struct TrainingHistory {
  std::vector<double> train_loss;
  std::vector<double> val_loss;
  std::vector<double> train_accuracy;
  std::vector<double> val_accuracy;
};

LineFigure training_curves_figure(const TrainingHistory& history, const std::string& title);
void write_training_curves(const std::filesystem::path& png, const TrainingHistory& history, const std::string& title);

}  // namespace kiln::io
