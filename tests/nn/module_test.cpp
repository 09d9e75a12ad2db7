#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "kiln/autograd/functions.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optimizer.h"
#include "kiln/tensor/random_generator.h"

namespace kiln {
namespace module_test {

using nn::Linear;
using nn::Module;

class Block : public nn::UnaryModule {
 public:
  Block() : UnaryModule("Block") {
    fc = register_module("fc", std::make_shared<Linear>(3, 4));
    scale = register_parameter("scale", Tensor::ones({4}));
    count = register_buffer("count", Tensor::zeros({1}));
    scratch = register_buffer("scratch", Tensor::zeros({2}), /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) override { return mul(fc->forward(x), scale); }
  std::shared_ptr<Linear> fc;
  Tensor scale, count, scratch;
};

class Net : public nn::UnaryModule {
 public:
  Net() : UnaryModule("Net") {
    block = register_module("block", std::make_shared<Block>());
    head = register_module("head", std::make_shared<Linear>(4, 2, /*bias=*/false));
  }
  Tensor forward(const Tensor& x) override { return head->forward(relu(block->forward(x))); }
  std::shared_ptr<Block> block;
  std::shared_ptr<Linear> head;
};

template <class D>
std::vector<std::string> keys_of(const D& d) {
  return d.keys();
}

TEST(Module, NamedParametersBuffersAndChildren) {
  auto net = std::make_shared<Net>();
  EXPECT_EQ(keys_of(net->named_parameters()),
            (std::vector<std::string>{"block.scale", "block.fc.weight", "block.fc.bias", "head.weight"}));
  EXPECT_EQ(keys_of(net->named_parameters(/*recursive=*/false)), std::vector<std::string>{});
  EXPECT_EQ(keys_of(net->named_buffers()), (std::vector<std::string>{"block.count", "block.scratch"}));
  // state_dict: parameters then persistent buffers, per module, depth first.
  EXPECT_EQ(keys_of(net->state_dict()), (std::vector<std::string>{"block.scale", "block.count", "block.fc.weight",
                                                                  "block.fc.bias", "head.weight"}));
  EXPECT_EQ(net->children().size(), 2u);
  EXPECT_EQ(keys_of(net->named_modules()), (std::vector<std::string>{"", "block", "block.fc", "head"}));
  EXPECT_EQ(net->num_parameters(), 4 + 12 + 4 + 8);
  for (const Tensor& p : net->parameters()) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
  }
}

TEST(Module, DuplicateNamesAndDotsAreRejected) {
  Module m("M");
  m.register_parameter("w", Tensor::zeros({1}));
  EXPECT_THROW(m.register_parameter("w", Tensor::zeros({1})), Error);
  EXPECT_THROW(m.register_buffer("w", Tensor::zeros({1})), Error);
  EXPECT_THROW(m.register_parameter("a.b", Tensor::zeros({1})), Error);
}

TEST(Module, SharedParametersAreListedOnce) {
  auto a = std::make_shared<Linear>(2, 2);
  Module m("Tied");
  m.register_module("a", a);
  m.register_parameter("tied", a->weight);
  EXPECT_EQ(keys_of(m.named_parameters()), (std::vector<std::string>{"tied", "a.bias"}));
  EXPECT_EQ(m.state_dict().size(), 3u);  // state_dict keeps both names, as PyTorch
}

TEST(Module, TrainEvalIsRecursive) {
  auto net = std::make_shared<Net>();
  EXPECT_TRUE(net->block->fc->is_training());
  net->eval();
  EXPECT_FALSE(net->is_training());
  EXPECT_FALSE(net->block->fc->is_training());
  net->train();
  EXPECT_TRUE(net->head->is_training());
}

TEST(Module, ToDTypeUpdatesEveryHandleInPlace) {
  auto net = std::make_shared<Net>();
  std::vector<Tensor> params = net->parameters();  // e.g. held by an optimizer created before to()
  std::vector<float> before = net->head->weight.to_vector<float>();
  net->to(DType::F64);
  EXPECT_EQ(net->head->weight.dtype(), DType::F64);
  EXPECT_EQ(params.back().dtype(), DType::F64);
  EXPECT_TRUE(params.back().is_same(net->head->weight));
  EXPECT_TRUE(net->head->weight.requires_grad());
  EXPECT_TRUE(net->head->weight.is_leaf());
  EXPECT_EQ(net->block->count.dtype(), DType::F64);
  std::vector<double> after = net->head->weight.to_vector<double>();
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], static_cast<double>(before[i]));
  // The model still trains after the conversion.
  Tensor x = Tensor::randn({5, 3}, 1, DType::F64);
  sum(net->forward(x)).backward();
  EXPECT_TRUE(net->head->weight.grad().defined());
  EXPECT_EQ(net->head->weight.grad().dtype(), DType::F64);
  net->to(Device::cpu());  // same device: a no-op that keeps the grads
  EXPECT_TRUE(net->head->weight.grad().defined());
}

TEST(Module, ToKeepsIntegerBuffers) {
  auto bn = std::make_shared<nn::BatchNorm2d>(3);
  bn->to(DType::F64);
  EXPECT_EQ(bn->running_mean.dtype(), DType::F64);
  EXPECT_EQ(bn->num_batches_tracked.dtype(), DType::I64);
  EXPECT_THROW(bn->to(DType::I32), Error);
}

TEST(Module, ZeroGrad) {
  auto lin = std::make_shared<Linear>(3, 2);
  sum(lin->forward(Tensor::ones({4, 3}))).backward();
  ASSERT_TRUE(lin->weight.grad().defined());
  lin->zero_grad(/*set_to_none=*/false);
  for (float g : lin->weight.grad().to_vector<float>()) EXPECT_EQ(g, 0.0f);
  lin->zero_grad();
  EXPECT_FALSE(lin->weight.grad().defined());
  EXPECT_FALSE(lin->bias.grad().defined());
}

TEST(Module, LoadStateDictCopiesValuesInPlace) {
  manual_seed(1);
  auto a = std::make_shared<Net>();
  auto b = std::make_shared<Net>();
  Tensor handle = b->head->weight;
  EXPECT_NE(a->head->weight.to_vector<float>(), b->head->weight.to_vector<float>());
  nn::LoadResult r = b->load_state_dict(a->state_dict());
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  EXPECT_EQ(handle.to_vector<float>(), a->head->weight.to_vector<float>());
  EXPECT_EQ(b->block->fc->bias.to_vector<float>(), a->block->fc->bias.to_vector<float>());
  // The values are copies: changing a does not change b.
  a->head->weight.detach().fill_(7.0);
  EXPECT_NE(handle.to_vector<float>(), a->head->weight.to_vector<float>());
}

TEST(Module, LoadStateDictErrorsNameTheKeys) {
  auto net = std::make_shared<Net>();
  TensorDict sd = net->state_dict();
  TensorDict broken;
  for (const auto& [k, v] : sd)
    if (k != "head.weight") broken.insert(k, v);
  broken.insert("head.extra", Tensor::zeros({1}));
  try {
    net->load_state_dict(broken);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("Missing key(s) in state_dict: \"head.weight\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("Unexpected key(s) in state_dict: \"head.extra\""), std::string::npos) << msg;
  }
  nn::LoadResult r = net->load_state_dict(broken, /*strict=*/false);
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"head.weight"});
  EXPECT_EQ(r.unexpected_keys, std::vector<std::string>{"head.extra"});

  TensorDict wrong_shape = net->state_dict();
  wrong_shape.set("block.fc.weight", Tensor::zeros({4, 4}));
  try {
    net->load_state_dict(wrong_shape, /*strict=*/false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("size mismatch for block.fc.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 3]"), std::string::npos) << msg;
  }
}

TEST(Module, SetTensorReplacesInPlace) {
  auto lin = std::make_shared<Linear>(3, 2);
  Tensor handle = lin->weight;
  lin->set_tensor("weight", Tensor::zeros({2, 5}));
  EXPECT_EQ(handle.shape(), (Shape{2, 5}));
  EXPECT_TRUE(handle.requires_grad());
  EXPECT_THROW(lin->set_tensor("nope", Tensor::zeros({1})), Error);
}

TEST(Module, ReprLikePyTorch) {
  auto seq = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<Linear>(4, 8), std::make_shared<nn::ReLU>(), std::make_shared<nn::Dropout>(0.1, 1),
      std::make_shared<Linear>(8, 2, false)});
  EXPECT_EQ(seq->repr(),
            "Sequential(\n"
            "  (0): Linear(in_features=4, out_features=8, bias=True)\n"
            "  (1): ReLU()\n"
            "  (2): Dropout(p=0.1, inplace=False)\n"
            "  (3): Linear(in_features=8, out_features=2, bias=False)\n"
            ")");
  auto net = std::make_shared<Net>();
  EXPECT_EQ(net->repr(),
            "Net(\n"
            "  (block): Block(\n"
            "    (fc): Linear(in_features=3, out_features=4, bias=True)\n"
            "  )\n"
            "  (head): Linear(in_features=4, out_features=2, bias=False)\n"
            ")");
  EXPECT_EQ(nn::Conv2d(3, 16, 3, {.padding = 1}).repr(),
            "Conv2d(3, 16, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))");
  EXPECT_EQ(nn::BatchNorm2d(16).repr(),
            "BatchNorm2d(16, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)");
  EXPECT_EQ(nn::LayerNorm(8).repr(), "LayerNorm((8,), eps=1e-05, elementwise_affine=True)");
  EXPECT_EQ(nn::MaxPool2d(2).repr(), "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)");
  EXPECT_EQ(nn::Embedding(10, 3).repr(), "Embedding(10, 3)");
  EXPECT_EQ(nn::Flatten().repr(), "Flatten(start_dim=1, end_dim=-1)");
}

TEST(Module, SaveAndLoadSafetensors) {
  std::string path = (std::filesystem::temp_directory_path() / "kiln_module_test.safetensors").string();
  manual_seed(3);
  auto a = std::make_shared<Net>();
  a->save(path);
  auto b = std::make_shared<Net>();
  b->load(path);
  for (const auto& [k, v] : a->state_dict())
    EXPECT_EQ(v.to_vector<float>(), b->state_dict().at(k).to_vector<float>()) << k;
  auto other = std::make_shared<Linear>(3, 3);
  EXPECT_THROW(other->load(path), Error);
  std::filesystem::remove(path);
}

TEST(Module, OptimizerCreatedBeforeToSeesConvertedParameters) {
  auto lin = std::make_shared<Linear>(2, 1);
  optim::SGD opt(lin->parameters(), {.lr = 0.5});
  lin->to(DType::F64);
  Tensor x = Tensor::ones({1, 2}, DType::F64);
  sum(lin->forward(x)).backward();
  std::vector<double> w = lin->weight.to_vector<double>();
  opt.step();
  std::vector<double> w2 = lin->weight.to_vector<double>();
  EXPECT_NEAR(w2[0], w[0] - 0.5, 1e-12);
  EXPECT_NEAR(w2[1], w[1] - 0.5, 1e-12);
}

// ---- layers that only need linear algebra
TEST(Layers, LinearMatchesFormulaAndDefaultInitBounds) {
  manual_seed(42);
  Linear lin(16, 5);
  const double bound = 1.0 / std::sqrt(16.0);
  for (float w : lin.weight.to_vector<float>()) EXPECT_LE(std::abs(w), bound);
  for (float b : lin.bias.to_vector<float>()) EXPECT_LE(std::abs(b), bound);
  Tensor x = Tensor::randn({3, 16}, 9);
  std::vector<float> y = lin.forward(x).to_vector<float>();
  std::vector<float> xv = x.to_vector<float>(), wv = lin.weight.to_vector<float>(), bv = lin.bias.to_vector<float>();
  for (int i = 0; i < 3; ++i)
    for (int o = 0; o < 5; ++o) {
      double ref = bv[o];
      for (int k = 0; k < 16; ++k) ref += static_cast<double>(xv[i * 16 + k]) * wv[o * 16 + k];
      EXPECT_NEAR(y[i * 5 + o], ref, 1e-5);
    }
  // Same seed, same construction order: same parameters.
  manual_seed(42);
  Linear again(16, 5);
  EXPECT_EQ(again.weight.to_vector<float>(), lin.weight.to_vector<float>());
  EXPECT_EQ(again.bias.to_vector<float>(), lin.bias.to_vector<float>());
  Linear next(16, 5);
  EXPECT_NE(next.weight.to_vector<float>(), lin.weight.to_vector<float>());
}

TEST(Layers, SequentialChainsAndBackpropagates) {
  manual_seed(5);
  auto l1 = std::make_shared<Linear>(3, 6);
  auto l2 = std::make_shared<Linear>(6, 2);
  nn::Sequential seq{l1, std::make_shared<nn::ReLU>(), l2};
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(seq.at<Linear>(2), l2);
  EXPECT_THROW(seq.at<Linear>(1), Error);
  Tensor x = Tensor::randn({4, 3}, 2);
  Tensor y = seq(x);
  Tensor ref = l2->forward(relu(l1->forward(x)));
  EXPECT_EQ(y.to_vector<float>(), ref.to_vector<float>());
  sum(y).backward();
  for (const Tensor& p : seq.parameters()) EXPECT_TRUE(p.grad().defined());
  EXPECT_EQ(seq.named_parameters().keys(), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
}

TEST(Layers, ModuleList) {
  nn::ModuleList list;
  list.push_back(std::make_shared<Linear>(2, 2)).push_back(std::make_shared<nn::ReLU>());
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(list.named_parameters().keys(), (std::vector<std::string>{"0.weight", "0.bias"}));
  EXPECT_NE(list.at<Linear>(0), nullptr);
  EXPECT_THROW(list[2], Error);
}

TEST(Layers, ActivationModules) {
  Tensor x = Tensor::from_vector<float>({-1.0f, 0.5f, 2.0f});
  EXPECT_EQ(nn::ReLU().forward(x).to_vector<float>(), relu(x).to_vector<float>());
  EXPECT_EQ(nn::GELU().forward(x).to_vector<float>(), gelu(x).to_vector<float>());
  EXPECT_EQ(nn::SiLU().forward(x).to_vector<float>(), silu(x).to_vector<float>());
  EXPECT_EQ(nn::Flatten().forward(Tensor::zeros({2, 3, 4})).shape(), (Shape{2, 12}));
}

TEST(Layers, DropoutIsIdentityInEvalAndWithZeroP) {
  nn::Dropout d(0.5, 7);
  d.eval();
  Tensor x = Tensor::ones({8});
  EXPECT_TRUE(d.forward(x).is_same(x));
  nn::Dropout none(0.0, 7);
  EXPECT_TRUE(none.forward(x).is_same(x));
  EXPECT_EQ(none.offset, 0u);
}

TEST(Layers, BatchNormBuffersMatchPyTorchNames) {
  nn::BatchNorm2d bn(4);
  EXPECT_EQ(bn.state_dict().keys(),
            (std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}));
  nn::BatchNorm1d plain(4, {.affine = false, .track_running_stats = false});
  EXPECT_TRUE(plain.state_dict().empty());
  EXPECT_THROW(bn.forward(Tensor::zeros({2, 3, 5, 5})), Error);  // wrong channel count
}

TEST(Generator, HandsOutDisjointRanges) {
  Generator g(11);
  RandomKey a = g.next(10), b = g.next(5);
  EXPECT_EQ(a.seed, 11u);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(b.offset, 10u);
  EXPECT_EQ(g.offset(), 15u);
  g.manual_seed(12);
  EXPECT_EQ(g.next(1).offset, 0u);
  EXPECT_EQ(g.seed(), 12u);
  Generator h(12);
  h.next(1);
  EXPECT_EQ(g.next_seed(), h.next_seed());
}

}  // namespace module_test
}  // namespace kiln
