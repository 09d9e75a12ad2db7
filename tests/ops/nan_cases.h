#pragma once
// NaN propagation, one case per op, run on any device: a NaN fed to an op must come out of it
// (and out of its backward) as PyTorch lets it out, so a diverged run is seen rather than
// reported with finite losses. The expected values are torch 1.13's on the same inputs (e.g.
// relu: forward [nan, 0, 2, 0], backward selects: 0 where x <= 0 even for a NaN gradient).
// Shared by tests/ops (CPU) and tests/cuda (the same cases on the GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/optim/clip_grad.h"
#include "kiln/optim/optimizer.h"
#include "kiln/tensor/tensor.h"

namespace kiln::nantest {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline Tensor t(const std::vector<float>& v, Shape s, Device d) { return Tensor::from_vector(v, std::move(s), d); }
inline Tensor leaf(const std::vector<float>& v, Shape s, Device d) {
  Tensor x = t(v, std::move(s), d);
  x.requires_grad_(true);
  return x;
}

// Element-wise equality where NaN equals NaN.
inline void expect_same(const Tensor& got, const std::vector<float>& want, const std::string& what) {
  std::vector<float> g = got.to_vector<float>();
  ASSERT_EQ(g.size(), want.size()) << what;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(want[i]))
      EXPECT_TRUE(std::isnan(g[i])) << what << "[" << i << "] is " << g[i] << ", expected NaN";
    else
      EXPECT_NEAR(g[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << what << "[" << i << "]";
  }
}
inline void expect_all_nan(const Tensor& got, const std::string& what) {
  std::vector<float> g = got.to_vector<float>();
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(std::isnan(g[i])) << what << "[" << i << "] is " << g[i];
}
inline void expect_all_finite(const Tensor& got, const std::string& what) {
  std::vector<float> g = got.to_vector<float>();
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(std::isfinite(g[i])) << what << "[" << i << "] is " << g[i];
}

struct NanCase {
  std::string name;
  std::function<void(Device)> run;
};

inline std::vector<NanCase> nan_cases() {
  const float n = kNaN;
  return {
      {"Relu",
       [n](Device d) {
         Tensor x = leaf({n, -1, 2, 0}, {4}, d);
         Tensor y = relu(x);
         expect_same(y, {n, 0, 2, 0}, "relu");
         y.backward(t({1, n, 3, 4}, {4}, d));
         expect_same(x.grad(), {1, 0, 3, 0}, "relu backward");
       }},
      {"ReluStrided",  // the non-contiguous path of the same kernels
       [n](Device d) {
         Tensor x = leaf({n, -1, 2, 0, 5, n}, {2, 3}, d);
         Tensor y = relu(x.transpose(0, 1));
         expect_same(y, {n, 0, 0, 5, 2, n}, "relu strided");
       }},
      {"LeakyRelu",
       [n](Device d) {
         Tensor x = leaf({n, -1, 2, 0}, {4}, d);
         Tensor y = leaky_relu(x, 0.1);
         expect_same(y, {n, -0.1f, 2, 0}, "leaky_relu");
         y.backward(t({1, n, 3, 4}, {4}, d));
         expect_same(x.grad(), {0.1f, n, 3, 0.4f}, "leaky_relu backward");
       }},
      {"SmoothActivations",
       [n](Device d) {
         Tensor x = t({n, 1}, {2}, d);
         for (auto [name, y] : std::vector<std::pair<std::string, Tensor>>{{"gelu", gelu(x)},
                                                                           {"gelu_tanh", gelu(x, true)},
                                                                           {"silu", silu(x)},
                                                                           {"sigmoid", sigmoid(x)},
                                                                           {"tanh", tanh(x)},
                                                                           {"abs", abs(x)},
                                                                           {"exp", exp(x)},
                                                                           {"square", square(x)}}) {
           EXPECT_TRUE(std::isnan(y.to_vector<float>()[0])) << name;
           EXPECT_FALSE(std::isnan(y.to_vector<float>()[1])) << name;
         }
       }},
      {"MaximumMinimum",
       [n](Device d) {
         Tensor a = t({n, 1, 2}, {3}, d), b = t({0, n, 1}, {3}, d);
         expect_same(maximum(a, b), {n, n, 2}, "maximum");
         expect_same(minimum(a, b), {n, n, 1}, "minimum");
       }},
      {"Clamp",
       [n](Device d) {
         Tensor x = leaf({n, -1, 2, 0}, {4}, d);
         Tensor y = clamp(x, -0.5, 0.5);
         expect_same(y, {n, -0.5f, 0.5f, 0}, "clamp");
         y.backward(t({1, 1, 1, 1}, {4}, d));
         expect_same(x.grad(), {0, 0, 0, 1}, "clamp backward");
       }},
      {"AmaxAminArgmaxArgmin",
       [n](Device d) {
         Tensor x = t({1, n, 3, 4, 5, 6, 7, 8}, {2, 4}, d);
         expect_same(amax(x, {1}), {n, 8}, "amax");
         expect_same(amin(x, {1}), {n, 5}, "amin");
         expect_same(amax(x), {n}, "amax all");
         EXPECT_EQ(argmax(x, 1).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 3}));
         EXPECT_EQ(argmin(x, 1).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 0}));
         Tensor late = t({1, 2, 3, n}, {1, 4}, d);  // a NaN after the running maximum
         EXPECT_EQ(argmax(late, 1).item(), 3);
         expect_same(amax(late, {1}), {n}, "amax late NaN");
       }},
      {"SumMeanVar",
       [n](Device d) {
         Tensor x = t({1, n, 3, 4}, {2, 2}, d);
         expect_same(sum(x, {1}), {n, 7}, "sum");
         expect_same(mean(x, {1}), {n, 3.5f}, "mean");
         expect_same(var(x, {1}), {n, 0.5f}, "var");
       }},
      {"MaxPool2x2",
       [n](Device d) {
         std::vector<float> v(16);
         for (int i = 0; i < 16; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(i);
         v[5] = n;  // window (0, 0); the larger 6 and 4 must not hide it
         Tensor x = leaf(v, {1, 1, 4, 4}, d);
         Tensor y = max_pool2d(x, 2);
         expect_same(y, {n, 7, 13, 15}, "max_pool2d 2x2");
         y.backward(t({1, 1, 1, 1}, {1, 1, 2, 2}, d));
         std::vector<float> g = x.grad().to_vector<float>();
         EXPECT_EQ(g[5], 1.0f) << "the gradient goes to the NaN, as PyTorch's indices say";
       }},
      {"MaxPoolGeneral",
       [n](Device d) {
         std::vector<float> v(16, 0.0f);
         v[0] = n;
         Tensor y = max_pool2d(t(v, {1, 1, 4, 4}, d), 3, 1, 1);
         std::vector<float> o = y.to_vector<float>();
         ASSERT_EQ(o.size(), 16u);
         for (int r = 0; r < 4; ++r)
           for (int c = 0; c < 4; ++c)
             EXPECT_EQ(std::isnan(o[static_cast<std::size_t>(r * 4 + c)]), r <= 1 && c <= 1) << r << "," << c;
       }},
      {"AvgPools",
       [n](Device d) {
         std::vector<float> v(16, 1.0f);
         v[0] = n;
         Tensor x = t(v, {1, 1, 4, 4}, d);
         expect_same(avg_pool2d(x, 2), {n, 1, 1, 1}, "avg_pool2d");
         expect_same(adaptive_avg_pool2d(x, 1, 1), {n}, "adaptive_avg_pool2d");
       }},
      {"SoftmaxAndCrossEntropy",
       [n](Device d) {
         Tensor x = t({1, n, 3, 1, 2, 3}, {2, 3}, d);
         Tensor s = softmax(x, 1), ls = log_softmax(x, 1);
         std::vector<float> sv = s.to_vector<float>(), lv = ls.to_vector<float>();
         for (int i = 0; i < 3; ++i) {
           EXPECT_TRUE(std::isnan(sv[static_cast<std::size_t>(i)])) << "softmax row 0, " << i;
           EXPECT_TRUE(std::isnan(lv[static_cast<std::size_t>(i)])) << "log_softmax row 0, " << i;
           EXPECT_TRUE(std::isfinite(sv[static_cast<std::size_t>(3 + i)])) << "softmax row 1, " << i;
         }
         Tensor target = Tensor::from_vector(std::vector<std::int64_t>{0, 2}, {2}, d);
         Tensor logits = leaf({1, n, 3, 1, 2, 3}, {2, 3}, d);
         Tensor loss = cross_entropy(logits, target);
         EXPECT_TRUE(std::isnan(loss.item())) << "cross_entropy of a row with a NaN logit";
         loss.backward();
         expect_all_nan(logits.grad().slice(0, 0, 1), "cross_entropy backward, the NaN row");
         expect_all_finite(logits.grad().slice(0, 1, 2), "cross_entropy backward, the other row");
       }},
      {"TopK",
       [n](Device d) {
         auto [values, indices] = topk(t({1, n, 3, 2}, {4}, d), 2);
         expect_same(values, {n, 3}, "topk values");
         EXPECT_EQ(indices.to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 2}));
       }},
      {"LinearAndConv",
       [n](Device d) {
         Tensor x = t({n, 1, 1, 1, 1, 1}, {2, 3}, d);
         Tensor w = t({1, 1, 1, 1, 1, 1}, {2, 3}, d);
         expect_same(linear(x, w), {n, n, 3, 3}, "linear");
         std::vector<float> img(16, 1.0f);
         img[0] = n;
         Tensor y = conv2d(t(img, {1, 1, 4, 4}, d), Tensor::ones({1, 1, 3, 3}, DType::F32, d));
         expect_same(y, {n, 9, 9, 9}, "conv2d");
       }},
      {"Norms",
       [n](Device d) {
         Tensor x = t({n, 1, 2, 3, 4, 5}, {2, 3}, d);
         expect_same(layer_norm(x, Tensor(), Tensor()).slice(0, 0, 1), {n, n, n}, "layer_norm row 0");
         expect_all_finite(layer_norm(x, Tensor(), Tensor()).slice(0, 1, 2), "layer_norm row 1");
         // Batch norm in training: the statistics of channel 0 hold the NaN, channel 1's do not.
         std::vector<float> v = {n, 1, 2, 3, 4, 5, 6, 7};
         Tensor rm = Tensor::zeros({2}, DType::F32, d), rv = Tensor::ones({2}, DType::F32, d);
         Tensor y = batch_norm(t(v, {2, 2, 1, 2}, d), Tensor::ones({2}, DType::F32, d),
                               Tensor::zeros({2}, DType::F32, d), rm, rv, true);
         std::vector<float> o = y.to_vector<float>();
         for (int b = 0; b < 2; ++b)
           for (int k = 0; k < 2; ++k) {
             EXPECT_TRUE(std::isnan(o[static_cast<std::size_t>(b * 4 + k)])) << "batch_norm channel 0";
             EXPECT_TRUE(std::isfinite(o[static_cast<std::size_t>(b * 4 + 2 + k)])) << "batch_norm channel 1";
           }
       }},
      {"OptimizerAndClipping",
       [n](Device d) {
         Tensor p = leaf({1, 2}, {2}, d);
         sum(mul(p, t({n, 1}, {2}, d))).backward();
         Tensor norm = optim::clip_grad_norm_({p}, 1.0);
         EXPECT_TRUE(std::isnan(norm.item())) << "the total norm of a NaN gradient";
         expect_all_nan(p.grad(), "clipped gradients (PyTorch: clip_coef NaN scales every gradient)");
         optim::Adam adam({p});
         adam.step();
         expect_all_nan(p, "parameters after Adam on NaN gradients");
       }},
  };
}

}  // namespace kiln::nantest
