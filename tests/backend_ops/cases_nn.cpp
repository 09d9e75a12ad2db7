// Cases of the network-layer kernels: convolution, pooling, normalisation, softmax, cross-entropy.
#include <cmath>
#include <string>
#include <tuple>

#include "harness.h"
#include "kiln/autograd/functions.h"

namespace kiln::backend_ops {

namespace cases_nn {

OpCase nn_case(std::string name, std::vector<std::string> kernels, std::vector<DType> dtypes,
               std::function<std::vector<Tensor>(bool)> inputs,
               std::function<std::vector<Tensor>(const std::vector<Tensor>&)> forward, std::vector<int> grad_inputs) {
  OpCase c;
  c.name = std::move(name);
  c.kernels = std::move(kernels);
  c.dtypes = std::move(dtypes);
  c.inputs = std::move(inputs);
  c.forward = std::move(forward);
  c.grad_inputs = std::move(grad_inputs);
  return c;
}

std::vector<Tensor> one(Tensor t) { return {std::move(t)}; }

// Softmax over the last dimension, directly in float64.
Tensor softmax_ref(const Tensor& x, bool log) {
  const std::int64_t cols = x.shape().back(), rows = x.numel() / cols;
  auto v = x.to_vector<double>();
  for (std::int64_t r = 0; r < rows; ++r) {
    double* p = v.data() + r * cols;
    double mx = p[0], s = 0;
    for (std::int64_t j = 1; j < cols; ++j) mx = std::max(mx, p[j]);
    for (std::int64_t j = 0; j < cols; ++j) s += std::exp(p[j] - mx);
    for (std::int64_t j = 0; j < cols; ++j) p[j] = log ? p[j] - mx - std::log(s) : std::exp(p[j] - mx) / s;
  }
  return Tensor::from_vector(v, x.shape());
}

}  // namespace cases_nn

void add_nn_cases(std::vector<OpCase>& cases) {
  using namespace cases_nn;  // this file's helpers (a named namespace: the tests compile in unity batches)
  const std::vector<DType> low = {DType::F32, DType::BF16};
  // Convolution: bias, stride, padding, dilation, groups; and the channels-last layout, which the
  // backends whose kernel takes it (kTakesChannelsLast) run as is.
  cases.push_back(nn_case(
      "conv2d/bias_stride_pad", {"conv2d_forward", "conv2d_backward"}, low,
      [](bool large) {
        return large
                   ? std::vector<Tensor>{randn({64, 64, 32, 32}, 90), randn({128, 64, 3, 3}, 91, 0.1), randn({128}, 92)}
                   : std::vector<Tensor>{randn({2, 3, 7, 6}, 90), randn({4, 3, 3, 3}, 91, 0.3), randn({4}, 92)};
      },
      [](const std::vector<Tensor>& in) {
        ops::Conv2dParams p;
        p.stride_h = 2;
        p.pad_h = p.pad_w = 1;
        return one(conv2d(in[0], in[1], in[2], p));
      },
      {0, 1, 2}));
  cases.push_back(nn_case(
      "conv2d/groups_dilation", {"conv2d_forward", "conv2d_backward"}, low,
      [](bool large) {
        return large ? std::vector<Tensor>{randn({32, 64, 32, 32}, 93), randn({64, 16, 3, 3}, 94, 0.1)}
                     : std::vector<Tensor>{randn({2, 4, 8, 8}, 93), randn({6, 2, 3, 3}, 94, 0.3)};
      },
      [](const std::vector<Tensor>& in) {
        ops::Conv2dParams p;
        p.groups = in[0].shape()[1] / in[1].shape()[1];
        p.dilation_h = p.dilation_w = 2;
        p.pad_h = p.pad_w = 2;
        return one(conv2d(in[0], in[1], Tensor(), p));
      },
      {0, 1}));
  cases.push_back(nn_case(
      "conv2d/channels_last", {"conv2d_forward", "conv2d_backward"}, low,
      [](bool large) {
        return large ? std::vector<Tensor>{randn({64, 64, 32, 32}, 95), randn({64, 64, 3, 3}, 96, 0.1)}
                     : std::vector<Tensor>{randn({2, 4, 6, 6}, 95), randn({5, 4, 3, 3}, 96, 0.3)};
      },
      [](const std::vector<Tensor>& in) {
        ops::Conv2dParams p;
        p.pad_h = p.pad_w = 1;
        return one(conv2d(to_channels_last(in[0]), to_channels_last(in[1]), Tensor(), p));
      },
      {0, 1}));

  auto image = [](std::uint64_t seed) {
    return [=](bool large) {
      return std::vector<Tensor>{distinct(large ? Shape{32, 64, 32, 32} : Shape{2, 3, 8, 7}, seed)};
    };
  };
  cases.push_back(nn_case("max_pool2d/k3s2p1", {"max_pool2d_forward", "max_pool2d_backward"}, low, image(100),
                          [](const std::vector<Tensor>& in) { return one(max_pool2d(in[0], 3, 2, 1)); }, {0}));
  cases.push_back(nn_case("avg_pool2d/k2", {"avg_pool2d_forward", "avg_pool2d_backward"}, low, image(101),
                          [](const std::vector<Tensor>& in) { return one(avg_pool2d(in[0], 2)); }, {0}));
  cases.push_back(nn_case("avg_pool2d/k3s2p1_exclude_pad", {"avg_pool2d_forward", "avg_pool2d_backward"}, low,
                          image(102),
                          [](const std::vector<Tensor>& in) { return one(avg_pool2d(in[0], 3, 2, 1, false)); }, {0}));
  cases.push_back(nn_case("adaptive_avg_pool2d/3x2", {"adaptive_avg_pool2d_forward", "adaptive_avg_pool2d_backward"},
                          low, image(103),
                          [](const std::vector<Tensor>& in) { return one(adaptive_avg_pool2d(in[0], 3, 2)); }, {0}));
  // Channels-last: CUDA keeps the layout (the ResNet head's global pool, and a 3x2 grid of windows).
  for (const auto& [tag, oh, ow] : {std::tuple{"channels_last_global", 1, 1}, std::tuple{"channels_last_3x2", 3, 2}})
    cases.push_back(nn_case(
        std::string("adaptive_avg_pool2d/") + tag, {"adaptive_avg_pool2d_forward", "adaptive_avg_pool2d_backward"}, low,
        image(104),
        [oh, ow](const std::vector<Tensor>& in) { return one(adaptive_avg_pool2d(to_channels_last(in[0]), oh, ow)); },
        {0}));

  cases.push_back(nn_case(
      "batch_norm/training", {"batch_norm_forward", "batch_norm_backward"}, low,
      [](bool large) {
        const Shape s = large ? Shape{64, 64, 32, 32} : Shape{4, 3, 5, 5};
        const std::int64_t ch = s[1];
        return std::vector<Tensor>{randn(s, 110, 2.0, 0.5), randn({ch}, 111, 0.2, 1.0), randn({ch}, 112),
                                   Tensor::zeros({ch}, DType::F64), Tensor::ones({ch}, DType::F64)};
      },
      [](const std::vector<Tensor>& in) {
        Tensor y = batch_norm(in[0], in[1], in[2], in[3], in[4], true, 0.1, 1e-5);
        return std::vector<Tensor>{y, in[3], in[4]};  // the running statistics are updated in place
      },
      {0, 1, 2}));
  cases.push_back(nn_case(
      "batch_norm/eval", {"batch_norm_forward"}, low,
      [](bool large) {
        const Shape s = large ? Shape{64, 64, 32, 32} : Shape{4, 3, 5, 5};
        const std::int64_t ch = s[1];
        return std::vector<Tensor>{randn(s, 113), randn({ch}, 114, 0.2, 1.0), randn({ch}, 115), randn({ch}, 116),
                                   rand_uniform({ch}, 117, 0.5, 2.0)};
      },
      [](const std::vector<Tensor>& in) { return one(batch_norm(in[0], in[1], in[2], in[3], in[4], false)); }, {}));
  // The fused epilogue (ResNet's blocks): relu?(batch_norm(x) + residual?); the channels-last case with
  // C a multiple of 8 takes the CUDA kernels' 16-byte packs, the NCHW one the element-wise kernels.
  auto bn_act_inputs = [](bool large) {
    const Shape s = large ? Shape{64, 64, 32, 32} : Shape{4, 16, 5, 5};
    const std::int64_t ch = s[1];
    return std::vector<Tensor>{randn(s, 120, 2.0, 0.5),         randn({ch}, 121, 0.2, 1.0),     randn({ch}, 122),
                               Tensor::zeros({ch}, DType::F64), Tensor::ones({ch}, DType::F64), randn(s, 123)};
  };
  for (const auto& [tag, residual, relu, cl] :
       {std::tuple{"relu", false, true, false}, std::tuple{"residual", true, false, false},
        std::tuple{"residual_relu", true, true, false}, std::tuple{"residual_relu_channels_last", true, true, true}})
    cases.push_back(nn_case(
        std::string("batch_norm_act/") + tag, {"batch_norm_forward", "batch_norm_backward"}, low, bn_act_inputs,
        [residual, relu, cl](const std::vector<Tensor>& in) {
          const auto layout = [cl](const Tensor& t) { return cl ? to_channels_last(t) : t; };
          Tensor y = batch_norm_act(layout(in[0]), in[1], in[2], in[3], in[4], true, 0.1, 1e-5,
                                    residual ? layout(in[5]) : Tensor(), relu);
          return std::vector<Tensor>{y, in[3], in[4]};
        },
        residual ? std::vector<int>{0, 1, 2, 5} : std::vector<int>{0, 1, 2}));
  auto rows = [](std::uint64_t seed) {
    return [=](bool large) {
      const Shape s = large ? Shape{8192, 1024} : Shape{6, 17};
      return std::vector<Tensor>{randn(s, seed, 1.5, 0.3), randn({s[1]}, seed + 1, 0.2, 1.0), randn({s[1]}, seed + 2)};
    };
  };
  cases.push_back(nn_case("layer_norm", {"layer_norm_forward", "layer_norm_backward"}, low, rows(120),
                          [](const std::vector<Tensor>& in) { return one(layer_norm(in[0], in[1], in[2], 1e-5)); },
                          {0, 1, 2}));
  cases.push_back(nn_case("rms_norm", {"rms_norm_forward", "rms_norm_backward"}, low, rows(123),
                          [](const std::vector<Tensor>& in) { return one(rms_norm(in[0], in[1], 1e-6)); }, {0, 1}));

  for (bool log : {false, true}) {
    OpCase c = nn_case(
        log ? "softmax/log" : "softmax/plain", {"softmax_forward", "softmax_backward"},
        {DType::F32, DType::BF16, DType::F16},
        [](bool large) {
          return std::vector<Tensor>{randn(large ? Shape{8192, 1024} : Shape{5, 3, 19}, 130, 2.0)};
        },
        [log](const std::vector<Tensor>& in) { return one(log ? log_softmax(in[0]) : softmax(in[0])); }, {0});
    c.reference = [log](const std::vector<Tensor>& in) { return one(softmax_ref(in[0], log)); };
    cases.push_back(std::move(c));
  }
  for (double smoothing : {0.0, 0.1}) {
    cases.push_back(nn_case(
        smoothing == 0 ? "cross_entropy/plain" : "cross_entropy/label_smoothing",
        {"cross_entropy_forward", "cross_entropy_backward"}, low,
        [](bool large) {
          const std::int64_t n = large ? 8192 : 7, classes = large ? 1000 : 11;
          std::vector<std::int64_t> target = rand_index({n}, 140, classes).to_vector<std::int64_t>();
          target[1] = -100;  // ignored
          return std::vector<Tensor>{randn({n, classes}, 141, 2.0), Tensor::from_vector(target, {n})};
        },
        [smoothing](const std::vector<Tensor>& in) { return one(cross_entropy(in[0], in[1], -100, smoothing)); }, {0}));
  }
}

}  // namespace kiln::backend_ops
