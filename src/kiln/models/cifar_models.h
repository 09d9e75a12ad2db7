#pragma once
// The CIFAR-10 models of the course project, and the standard CIFAR ResNet-18.
//
// simple_cnn (1,276,234 parameters), exactly the course's:
//   conv 3->32 3x3 pad 1, ReLU, maxpool 2
//   conv 32->64 3x3 pad 1, ReLU, maxpool 2
//   conv 64->128 3x3 pad 1, ReLU, maxpool 2          -> 128 x 4 x 4 = 2048
//   fc 2048->512, ReLU, dropout 0.5
//   fc 512->256, ReLU, dropout 0.5
//   fc 256->10
//
// simple_resnet (2,777,674 parameters), the course's ResNet of basic blocks:
//   stem: conv 3->64 3x3 pad 1 (no bias), BN, ReLU
//   stage 1: 2 basic blocks, 64 channels, stride 1        (32 x 32)
//   stage 2: 2 basic blocks, 128 channels, first stride 2  (16 x 16)
//   stage 3: 2 basic blocks, 256 channels, first stride 2  (8 x 8)
//   global average pool, fc 256->10
//   basic block: conv3x3(stride)-BN-ReLU-conv3x3-BN, plus the shortcut (identity, or conv1x1(stride)
//   + BN when the stride or the width changes), then ReLU.
//
// resnet18 (11,173,962 parameters): the CIFAR variant (3x3 stem, no max-pool), stages of 2 basic
// blocks with 64/128/256/512 channels, global average pool, fc 512->10.
#include <memory>
#include <string>
#include <vector>

#include "kiln/nn/nn.h"

namespace kiln::models {

class SimpleCNN : public nn::UnaryModule {
 public:
  explicit SimpleCNN(int num_classes = 10, double dropout = 0.5);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::Linear> fc1, fc2, fc3;
  std::shared_ptr<nn::Dropout> drop1, drop2;
};

class BasicBlock : public nn::UnaryModule {
 public:
  BasicBlock(std::int64_t in_channels, std::int64_t out_channels, int stride);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::Sequential> shortcut;  // empty: identity
};

// A CIFAR ResNet: 3x3 stem, stages of basic blocks (the first of each stage but the first has
// stride 2), global average pool, linear classifier.
class CifarResNet : public nn::UnaryModule {
 public:
  CifarResNet(std::string type_name, std::vector<std::int64_t> widths, int blocks_per_stage, int num_classes = 10);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Conv2d> stem;
  std::shared_ptr<nn::BatchNorm2d> stem_bn;
  std::shared_ptr<nn::Sequential> stages;
  std::shared_ptr<nn::Linear> fc;
};

// The registered names, in the order `kiln train-cifar10 --help` lists them.
const std::vector<std::string>& cifar_model_names();
// Builds a model by name; an unknown name raises an error listing the known ones.
std::shared_ptr<nn::UnaryModule> make_cifar_model(const std::string& name, int num_classes = 10);

}  // namespace kiln::models
