// The figure writers, checked by decoding the PNGs they write. The images are also left in
// build/test_scratch/io/ for a look.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "io_test_util.h"
#include "kiln/io/image_grid.h"
#include "kiln/io/line_plot.h"
#include "kiln/io/png_reader.h"
#include "kiln/io/training_curves.h"

namespace kiln::io {
namespace plots_test {

int count_color(const Image& image, int x0, int x1, int r, int g, int b, int tolerance = 12) {
  int n = 0;
  for (int y = 0; y < image.height; ++y) {
    for (int x = x0; x < x1; ++x) {
      const auto* p = image.at(x, y);
      n += std::abs(p[0] - r) <= tolerance && std::abs(p[1] - g) <= tolerance && std::abs(p[2] - b) <= tolerance;
    }
  }
  return n;
}

void expect_ticks(const std::vector<double>& ticks, const std::vector<double>& expected) {
  ASSERT_EQ(ticks.size(), expected.size());
  for (std::size_t i = 0; i < ticks.size(); ++i) EXPECT_NEAR(ticks[i], expected[i], 1e-12) << i;
}

TEST(NiceTicks, AreRoundNumbersCoveringTheRange) {
  expect_ticks(nice_ticks(0, 1, 5), {0, 0.2, 0.4, 0.6, 0.8, 1});
  expect_ticks(nice_ticks(1, 10, 8), {2, 4, 6, 8, 10});
  // 1.96 / 6 = 0.33 per step rounds up to 0.5: ticks inside the range only.
  auto t = nice_ticks(0.31, 2.27, 6);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_NEAR(t.front(), 0.5, 1e-12);
  EXPECT_NEAR(t.back(), 2.0, 1e-12);
  expect_ticks(nice_ticks(-0.3, 0.3, 6), {-0.3, -0.2, -0.1, 0, 0.1, 0.2, 0.3});
}

TEST(TrainingCurves, TwoPanelsWithBothCurvesInTheirColours) {
  TrainingHistory h;
  for (int e = 0; e < 20; ++e) {
    h.train_loss.push_back(2.1 * std::exp(-0.12 * e) + 0.3);
    h.val_loss.push_back(2.0 * std::exp(-0.1 * e) + 0.5 + 0.004 * e * e);
    h.train_accuracy.push_back(0.35 + 0.55 * (1 - std::exp(-0.15 * e)));
    h.val_accuracy.push_back(0.33 + 0.45 * (1 - std::exp(-0.15 * e)));
  }
  h.val_accuracy[4] = std::numeric_limits<double>::quiet_NaN();  // a skipped validation pass
  auto file = testing::scratch_dir() / "training_curves.png";
  write_training_curves(file, h, "SimpleCNN on CIFAR-10");
  auto image = read_png(file);
  const LineFigure defaults;
  ASSERT_EQ(image.width, 2 * defaults.panel_width);
  ASSERT_EQ(image.height, defaults.panel_height + 44);
  ASSERT_EQ(image.channels, 3);
  const int half = image.width / 2;
  // Train (blue 0,115,178) and validation (vermillion 214,94,0) in each panel.
  for (auto [x0, x1] : {std::pair{0, half}, std::pair{half, image.width}}) {
    EXPECT_GT(count_color(image, x0, x1, 0, 115, 178), 300) << "train curve in panel at x " << x0;
    EXPECT_GT(count_color(image, x0, x1, 214, 94, 0), 300) << "validation curve in panel at x " << x0;
  }
  // Mostly white background, and dark text/axes.
  EXPECT_GT(count_color(image, 0, image.width, 255, 255, 255, 0), image.width * image.height / 2);
  EXPECT_GT(count_color(image, 0, image.width, 30, 30, 30, 30), 2000);
}

TEST(LinePlot, RejectsMismatchedSeries) {
  LineFigure f;
  f.panels.push_back({"p", "x", "y", {{"s", {1, 2}, {1}}}, std::nullopt, "", false});
  EXPECT_CONTAINS(testing::error_of([&] { render_line_figure(f); }), "series 's' has 2 x and 1 y values");
}

TEST(PredictionGrid, EnlargesEachImageAndFramesWrongPredictionsInRed) {
  // Ten 32x32 images: a colour gradient that differs per image.
  const int n = 10;
  std::vector<std::uint8_t> images(n * 3072);
  for (int i = 0; i < n; ++i) {
    for (int y = 0; y < 32; ++y) {
      for (int x = 0; x < 32; ++x) {
        images[std::size_t(i) * 3072 + std::size_t(y) * 32 + x] = std::uint8_t(x * 8);
        images[std::size_t(i) * 3072 + 1024 + std::size_t(y) * 32 + x] = std::uint8_t(y * 8);
        images[std::size_t(i) * 3072 + 2048 + std::size_t(y) * 32 + x] = std::uint8_t(i * 25);
      }
    }
  }
  std::vector<PredictionSample> samples;
  for (int i = 0; i < n; ++i) {
    const bool wrong = i % 4 == 1;
    samples.push_back({images.data() + std::size_t(i) * 3072, i % 10, wrong ? (i + 3) % 10 : i % 10, 0.5f + 0.05f * i});
  }
  PredictionGridOptions options;
  options.columns = 4;
  options.class_names = {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};
  options.title = "test images";
  auto file = testing::scratch_dir() / "inference_results.png";
  write_prediction_grid(file, samples, options);
  auto image = read_png(file);
  const auto l = prediction_grid_layout(options);
  ASSERT_EQ(image.width, 4 * l.cell_width);
  ASSERT_EQ(image.height, l.header_height + 3 * l.cell_height);

  for (int i = 0; i < n; ++i) {
    const int x0 = (i % 4) * l.cell_width + l.picture_left;
    const int y0 = l.header_height + (i / 4) * l.cell_height + l.picture_top;
    // Every enlarged pixel is its source pixel (nearest neighbour, scale 4).
    for (int y = 0; y < 128; ++y) {
      for (int x = 0; x < 128; ++x) {
        const auto* p = image.at(x0 + x, y0 + y);
        ASSERT_EQ(p[0], (x / 4) * 8) << "image " << i << " at " << x << "," << y;
        ASSERT_EQ(p[1], (y / 4) * 8) << "image " << i << " at " << x << "," << y;
        ASSERT_EQ(p[2], i * 25) << "image " << i << " at " << x << "," << y;
      }
    }
    const bool wrong = samples[std::size_t(i)].true_label != samples[std::size_t(i)].predicted_label;
    const auto* frame = image.at(x0 - 2, y0 + 64);  // inside a 3-pixel red frame; outside a 1-pixel green one
    if (wrong) {
      EXPECT_TRUE(frame[0] > 200 && frame[1] < 40 && frame[2] < 40) << "image " << i << " should be framed in red";
    } else {
      EXPECT_EQ(frame[0] + frame[1] + frame[2], 3 * 255) << "image " << i << " should have no thick frame";
      const auto* green = image.at(x0 - 1, y0 + 64);
      EXPECT_TRUE(green[1] > 120 && green[0] < 60) << "image " << i << " should be framed in green";
    }
  }
  // Captions: red text only under wrong predictions.
  const int caption_y0 = l.picture_top + 128 + l.border;
  auto red_caption_pixels = [&](int i) {
    int count = 0;
    const int cx = (i % 4) * l.cell_width, cy = l.header_height + (i / 4) * l.cell_height + caption_y0;
    for (int y = cy; y < cy + 40 && y < image.height; ++y) {
      for (int x = cx; x < cx + l.cell_width; ++x) {
        const auto* p = image.at(x, y);
        count += p[0] > 180 && p[1] < 90 && p[2] < 90;
      }
    }
    return count;
  };
  EXPECT_GT(red_caption_pixels(1), 20);
  EXPECT_EQ(red_caption_pixels(0), 0);
}

}  // namespace plots_test
}  // namespace kiln::io
