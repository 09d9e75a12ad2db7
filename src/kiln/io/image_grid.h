#pragma once
// inference_results.png: a grid of images, each enlarged (nearest neighbour, so pixels stay
// crisp) and captioned with its true class, the predicted class and the confidence. A wrong
// prediction gets a red frame and a red caption; a right one a thin green frame.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "kiln/io/image.h"

namespace kiln::io {

struct PredictionSample {
  const std::uint8_t* image = nullptr;  // channels x height x width bytes, planar (CIFAR layout)
  int true_label = 0;
  int predicted_label = 0;
  float confidence = 0;  // probability of the predicted class, 0..1
};

struct PredictionGridOptions {
  int channels = 3;  // 3 (RGB) or 1 (gray)
  int height = 32;
  int width = 32;
  int columns = 8;
  int scale = 4;                         // each image pixel becomes scale x scale pixels
  std::vector<std::string> class_names;  // label -> name; numbers are shown when empty
  std::string title;                     // "N of M right" is appended
};

Image render_prediction_grid(std::span<const PredictionSample> samples, const PredictionGridOptions& options);
void write_prediction_grid(const std::filesystem::path& png, std::span<const PredictionSample> samples,
                           const PredictionGridOptions& options);

// Geometry, so tests can find each cell's pixels.
struct PredictionGridLayout {
  int cell_width, cell_height;    // including the gap around the picture
  int picture_left, picture_top;  // the enlarged image's offset inside a cell
  int header_height;              // title band above the first row
  int border;                     // frame thickness around the picture
};
PredictionGridLayout prediction_grid_layout(const PredictionGridOptions& options);

}  // namespace kiln::io
