#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>

#include "io_test_util.h"
#include "kiln/io/png_reader.h"
#include "kiln/io/png_writer.h"

namespace kiln::io {
namespace png_test {

Image random_image(int w, int h, int c, unsigned seed) {
  std::mt19937 rng(seed);
  Image image(w, h, c);
  for (auto& v : image.pixels) v = static_cast<std::uint8_t>(rng() & 0xff);
  return image;
}

TEST(Png, GrayRgbAndRgbaRoundTripExactly) {
  auto dir = testing::scratch_dir();
  for (int channels : {1, 3, 4}) {
    auto image = random_image(37, 19, channels, unsigned(channels));
    auto file = dir / fmt::format("image{}.png", channels);
    write_png(file, image);
    auto back = read_png(file);
    EXPECT_EQ(back.width, 37);
    EXPECT_EQ(back.height, 19);
    EXPECT_EQ(back.channels, channels);
    EXPECT_EQ(back.pixels, image.pixels) << channels << " channels";
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().extension(), ".png") << "left behind: " << entry.path();
  }
}

TEST(Png, ReplacesAnExistingFile) {
  auto file = testing::scratch_dir() / "a.png";
  write_png(file, random_image(4, 4, 3, 1));
  auto second = random_image(8, 2, 3, 2);
  write_png(file, second);
  EXPECT_EQ(read_png(file).pixels, second.pixels);
}

TEST(Png, BadInputNamesTheFile) {
  auto dir = testing::scratch_dir();
  EXPECT_CONTAINS(testing::error_of([&] { read_png(dir / "missing.png"); }), "missing.png");
  std::ofstream(dir / "text.png") << "not a png at all";
  EXPECT_CONTAINS(testing::error_of([&] { read_png(dir / "text.png"); }),
                  fmt::format("'{}' is not a PNG", (dir / "text.png").string()));
  // A valid header with the pixel data cut off.
  write_png(dir / "cut.png", random_image(64, 64, 3, 3));
  std::filesystem::resize_file(dir / "cut.png", 200);
  auto message = testing::error_of([&] { read_png(dir / "cut.png"); });
  EXPECT_CONTAINS(message, fmt::format("cannot decode PNG '{}'", (dir / "cut.png").string()));
  Image two_channels(2, 2, 2);
  EXPECT_CONTAINS(testing::error_of([&] { write_png(dir / "x.png", two_channels); }), "2 channels");
  EXPECT_FALSE(std::filesystem::exists(dir / "x.png"));
}

}  // namespace png_test
}  // namespace kiln::io
