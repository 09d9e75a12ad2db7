#include "kiln/nn/init.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kiln {
namespace init_test {

using namespace nn::init;

void stats(const Tensor& t, double& mean, double& std, double& max_abs) {
  std::vector<double> v = t.to_vector<double>();
  double s = 0, s2 = 0;
  max_abs = 0;
  for (double x : v) {
    s += x;
    s2 += x * x;
    max_abs = std::max(max_abs, std::abs(x));
  }
  mean = s / static_cast<double>(v.size());
  std = std::sqrt(s2 / static_cast<double>(v.size()) - mean * mean);
}

TEST(Init, GainsAndFans) {
  EXPECT_DOUBLE_EQ(calculate_gain(Nonlinearity::ReLU), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(calculate_gain(Nonlinearity::Tanh), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(calculate_gain(Nonlinearity::LeakyReLU, std::sqrt(5.0)), std::sqrt(2.0 / 6.0));
  EXPECT_DOUBLE_EQ(calculate_gain(Nonlinearity::Linear), 1.0);
  auto [fi, fo] = fan_in_and_fan_out(Tensor::empty({16, 8, 3, 3}));
  EXPECT_EQ(fi, 72);
  EXPECT_EQ(fo, 144);
  EXPECT_THROW(fan_in_and_fan_out(Tensor::empty({5})), Error);
}

TEST(Init, DistributionsHaveTheRightScale) {
  Generator gen(7);
  double m, s, mx;
  Tensor w = Tensor::empty({256, 512});
  kaiming_normal_(w, 0.0, FanMode::FanIn, Nonlinearity::ReLU, &gen);
  stats(w, m, s, mx);
  EXPECT_NEAR(m, 0.0, 0.005);
  EXPECT_NEAR(s, std::sqrt(2.0 / 512), 0.03 * std::sqrt(2.0 / 512));
  kaiming_uniform_(w, 0.0, FanMode::FanOut, Nonlinearity::ReLU, &gen);
  stats(w, m, s, mx);
  const double bound = std::sqrt(3.0) * std::sqrt(2.0 / 256);
  EXPECT_LE(mx, bound);
  EXPECT_GT(mx, 0.99 * bound);
  EXPECT_NEAR(s, bound / std::sqrt(3.0), 0.03 * bound);
  xavier_uniform_(w, 1.0, &gen);
  stats(w, m, s, mx);
  EXPECT_LE(mx, std::sqrt(6.0 / 768));
  xavier_normal_(w, 2.0, &gen);
  stats(w, m, s, mx);
  EXPECT_NEAR(s, 2.0 * std::sqrt(2.0 / 768), 0.03 * 2.0 * std::sqrt(2.0 / 768));
  normal_(w, 1.0, 0.02, &gen);
  stats(w, m, s, mx);
  EXPECT_NEAR(m, 1.0, 0.001);
  EXPECT_NEAR(s, 0.02, 0.001);
  uniform_(w, -1, 3, &gen);
  stats(w, m, s, mx);
  EXPECT_NEAR(m, 1.0, 0.02);
  EXPECT_LE(mx, 3.0);
  zeros_(w);
  stats(w, m, s, mx);
  EXPECT_EQ(mx, 0.0);
  ones_(w);
  EXPECT_EQ(w.to_vector<float>()[7], 1.0f);
}

TEST(Init, ReproducibleFromSeedAndStrided) {
  Generator a(3), b(3);
  Tensor x = Tensor::empty({4, 6}), y = Tensor::empty({4, 6});
  normal_(x, 0, 1, &a);
  normal_(y, 0, 1, &b);
  EXPECT_EQ(x.to_vector<float>(), y.to_vector<float>());
  normal_(y, 0, 1, &b);  // the next draw continues the stream
  EXPECT_NE(x.to_vector<float>(), y.to_vector<float>());
  Tensor base = Tensor::zeros({6, 4});
  Tensor t = base.t();  // strided view: filled through a contiguous temporary
  uniform_(t, 1, 2, &a);
  for (float v : base.to_vector<float>()) EXPECT_TRUE(v >= 1 && v < 2);
  // The default generator follows kiln::manual_seed.
  manual_seed(99);
  Tensor p = Tensor::empty({8}), q = Tensor::empty({8});
  normal_(p);
  manual_seed(99);
  normal_(q);
  EXPECT_EQ(p.to_vector<float>(), q.to_vector<float>());
}

}  // namespace init_test
}  // namespace kiln
