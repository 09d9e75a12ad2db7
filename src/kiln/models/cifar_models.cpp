#include "kiln/models/cifar_models.h"

#include <fmt/ranges.h>

#include "kiln/autograd/functions.h"

namespace kiln::models {

SimpleCNN::SimpleCNN(int num_classes, double dropout) : UnaryModule("SimpleCNN") {
  nn::Conv2dOptions same{.stride = 1, .padding = 1};
  conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(3, 32, 3, same));
  conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(32, 64, 3, same));
  conv3 = register_module("conv3", std::make_shared<nn::Conv2d>(64, 128, 3, same));
  fc1 = register_module("fc1", std::make_shared<nn::Linear>(128 * 4 * 4, 512));
  fc2 = register_module("fc2", std::make_shared<nn::Linear>(512, 256));
  fc3 = register_module("fc3", std::make_shared<nn::Linear>(256, num_classes));
  drop1 = register_module("drop1", std::make_shared<nn::Dropout>(dropout));
  drop2 = register_module("drop2", std::make_shared<nn::Dropout>(dropout));
}

Tensor SimpleCNN::forward(const Tensor& x) {
  Tensor h = max_pool2d(relu(conv1->forward(x)), 2);
  h = max_pool2d(relu(conv2->forward(h)), 2);
  h = max_pool2d(relu(conv3->forward(h)), 2);
  h = h.flatten(1);
  h = drop1->forward(relu(fc1->forward(h)));
  h = drop2->forward(relu(fc2->forward(h)));
  return fc3->forward(h);
}

BasicBlock::BasicBlock(std::int64_t in_channels, std::int64_t out_channels, int stride) : UnaryModule("BasicBlock") {
  conv1 = register_module(
      "conv1", std::make_shared<nn::Conv2d>(in_channels, out_channels, 3,
                                            nn::Conv2dOptions{.stride = stride, .padding = 1, .bias = false}));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(out_channels));
  conv2 = register_module("conv2",
                          std::make_shared<nn::Conv2d>(out_channels, out_channels, 3,
                                                       nn::Conv2dOptions{.stride = 1, .padding = 1, .bias = false}));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(out_channels));
  shortcut = register_module("shortcut", std::make_shared<nn::Sequential>());
  if (stride != 1 || in_channels != out_channels) {
    shortcut->push_back(std::make_shared<nn::Conv2d>(in_channels, out_channels, 1,
                                                     nn::Conv2dOptions{.stride = stride, .padding = 0, .bias = false}));
    shortcut->push_back(std::make_shared<nn::BatchNorm2d>(out_channels));
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  // The ReLUs and the shortcut's add run inside the batch norms' elementwise passes (batch_norm_act).
  Tensor h = bn1->forward_act(conv1->forward(x), Tensor(), true);
  return bn2->forward_act(conv2->forward(h), shortcut->size() ? shortcut->forward(x) : x, true);
}

CifarResNet::CifarResNet(std::string type_name, std::vector<std::int64_t> widths, int blocks_per_stage, int num_classes)
    : UnaryModule(std::move(type_name)) {
  stem = register_module("stem", std::make_shared<nn::Conv2d>(
                                     3, widths[0], 3, nn::Conv2dOptions{.stride = 1, .padding = 1, .bias = false}));
  stem_bn = register_module("stem_bn", std::make_shared<nn::BatchNorm2d>(widths[0]));
  stages = register_module("stages", std::make_shared<nn::Sequential>());
  std::int64_t in = widths[0];
  for (std::size_t s = 0; s < widths.size(); ++s) {
    for (int b = 0; b < blocks_per_stage; ++b) {
      int stride = (s > 0 && b == 0) ? 2 : 1;
      stages->push_back(std::make_shared<BasicBlock>(in, widths[s], stride));
      in = widths[s];
    }
  }
  fc = register_module("fc", std::make_shared<nn::Linear>(in, num_classes));
}

Tensor CifarResNet::forward(const Tensor& x) {
  Tensor h = stem_bn->forward_act(stem->forward(x), Tensor(), true);
  h = stages->forward(h);
  h = adaptive_avg_pool2d(h, 1, 1).flatten(1);
  return fc->forward(h);
}

const std::vector<std::string>& cifar_model_names() {
  static const std::vector<std::string> names{"simple_cnn", "simple_resnet", "resnet18"};
  return names;
}

std::shared_ptr<nn::UnaryModule> make_cifar_model(const std::string& name, int num_classes) {
  if (name == "simple_cnn") return std::make_shared<SimpleCNN>(num_classes);
  if (name == "simple_resnet")
    return std::make_shared<CifarResNet>("SimpleResNet", std::vector<std::int64_t>{64, 128, 256}, 2, num_classes);
  if (name == "resnet18")
    return std::make_shared<CifarResNet>("ResNet18", std::vector<std::int64_t>{64, 128, 256, 512}, 2, num_classes);
  KILN_FAIL("unknown model '{}': known models are {}", name, fmt::join(cifar_model_names(), ", "));
}

}  // namespace kiln::models
