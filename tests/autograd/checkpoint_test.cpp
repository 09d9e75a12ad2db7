// Activation recompute (autograd/checkpoint.h), the engine's autograd::grad() and random-draw
// replay: recomputed gradients are bit-identical to plain backward on the CPU, dropout included.
#include "kiln/autograd/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/functions.h"
#include "kiln/autograd/grad_ready_hook.h"
#include "kiln/nn/nn.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/tensor/random_generator.h"

namespace kiln {
namespace checkpoint_test {

using autograd::checkpoint;

// Bitwise equality of two float32 tensors' values.
void expect_bit_identical(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined()) << what;
  ASSERT_TRUE(b.defined()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  auto x = a.to_vector<float>(), y = b.to_vector<float>();
  std::size_t differing = 0;
  for (std::size_t i = 0; i < x.size(); ++i) differing += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
  EXPECT_EQ(differing, 0u) << what << ": " << differing << " of " << x.size() << " elements differ";
}

// A block with parameters, two dropouts (module and generator-keyed functional) and a
// nonlinearity: every kind of state a recompute must reproduce.
struct Block {
  nn::Linear fc1{16, 32}, fc2{32, 16};
  nn::Dropout drop{0.3, 1234};
  Tensor forward(const Tensor& x) {
    Tensor h = gelu(fc1.forward(x));
    h = drop.forward(h);
    const RandomKey key = default_generator().next(static_cast<std::uint64_t>(h.numel()));
    h = dropout(h, 0.25, true, key.seed, key.offset);
    return fc2.forward(h);
  }
  std::vector<Tensor> parameters() {
    auto a = fc1.parameters(), b = fc2.parameters();
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
};

struct RunResult {
  std::vector<Tensor> grads;  // x, then the parameters
  std::uint64_t dropout_offset, generator_offset;
};

RunResult run(Block& block, bool recompute, int layers) {
  manual_seed(99);
  block.drop.offset = 0;
  Tensor x = Tensor::randn({4, 16}, 7).requires_grad_();
  for (Tensor& p : block.parameters()) p.set_grad(Tensor());
  Tensor h = x;
  for (int l = 0; l < layers; ++l) {
    // The same block applied repeatedly: its parameters are used several times, inside
    // checkpoints only (so their gradient sums are grouped alike in both modes).
    if (recompute)
      h = checkpoint([&](const std::vector<Tensor>& in) { return block.forward(in[0]); }, {h});
    else
      h = block.forward(h);
    h = tanh(h);  // outside the checkpoints
  }
  sum(h * h).backward();
  RunResult r{{x.grad()}, block.drop.offset, default_generator().offset()};
  for (const Tensor& p : block.parameters()) r.grads.push_back(p.grad());
  return r;
}

TEST(Checkpoint, RecomputeGivesBitIdenticalGradientsWithDropout) {
  manual_seed(1);
  Block block;
  for (int layers : {1, 3}) {
    RunResult plain = run(block, false, layers);
    RunResult recomputed = run(block, true, layers);
    for (std::size_t i = 0; i < plain.grads.size(); ++i)
      expect_bit_identical(recomputed.grads[i], plain.grads[i], fmt::format("{} layers, gradient {}", layers, i));
    // The recompute replays the draws without advancing anything a second time.
    EXPECT_EQ(recomputed.dropout_offset, plain.dropout_offset);
    EXPECT_EQ(recomputed.generator_offset, plain.generator_offset);
  }
}

TEST(Checkpoint, GraphSafeDropoutIsReplayed) {
  manual_seed(2);
  Block block;
  block.drop.graph_safe = true;  // the offset lives in a device (here CPU) counter
  RunResult plain = run(block, false, 2);
  RunResult recomputed = run(block, true, 2);
  for (std::size_t i = 0; i < plain.grads.size(); ++i)
    expect_bit_identical(recomputed.grads[i], plain.grads[i], fmt::format("gradient {}", i));
}

TEST(Checkpoint, NestedCheckpointsMatch) {
  manual_seed(3);
  Block inner, outer;
  auto forward = [&](bool recompute) {
    manual_seed(5);
    inner.drop.offset = outer.drop.offset = 0;
    Tensor x = Tensor::randn({3, 16}, 8).requires_grad_();
    auto body = [&](const std::vector<Tensor>& in) {
      Tensor h = recompute ? checkpoint([&](const std::vector<Tensor>& i2) { return inner.forward(i2[0]); }, {in[0]})
                           : inner.forward(in[0]);
      return outer.forward(tanh(h));
    };
    Tensor y = recompute ? checkpoint(body, {x}) : body({x});
    sum(y * y).backward();
    std::vector<Tensor> grads{x.grad()};
    for (Block* b : {&inner, &outer})
      for (Tensor& p : b->parameters()) {
        grads.push_back(p.grad());
        p.set_grad(Tensor());
      }
    return grads;
  };
  auto plain = forward(false);
  auto recomputed = forward(true);
  for (std::size_t i = 0; i < plain.size(); ++i)
    expect_bit_identical(recomputed[i], plain[i], fmt::format("gradient {}", i));
}

TEST(Checkpoint, ParameterUsedInsideAndOutsideGetsOneHookCallWithTheFullGradient) {
  Tensor w = Tensor::from_vector<double>({0.5, -1.5, 2.0}).requires_grad_();
  Tensor x = Tensor::from_vector<double>({1.0, 2.0, 3.0});
  int calls = 0;
  std::vector<double> seen;
  auto hook = autograd::register_grad_ready_hook(w, [&](const Tensor& leaf) {
    ++calls;
    seen = leaf.grad().to_vector<double>();
  });
  // y = sum(w * x * w) (inside) + sum(3 w) (outside): dy/dw = 2 w x + 3.
  Tensor inside = checkpoint([&](const std::vector<Tensor>& in) { return w * in[0] * w; }, {x});
  sum(inside + w * 3.0).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{2 * 0.5 * 1 + 3, 2 * -1.5 * 2 + 3, 2 * 2.0 * 3 + 3}));
  EXPECT_EQ(w.grad().to_vector<double>(), seen);
}

TEST(Checkpoint, RetainGraphRecomputesAgain) {
  Tensor x = Tensor::from_vector<double>({1.0, -2.0}).requires_grad_();
  nn::Dropout drop(0.5, 77);
  Tensor y = checkpoint([&](const std::vector<Tensor>& in) { return drop.forward(in[0] * in[0]); }, {x});
  sum(y).backward(Tensor(), /*retain_graph=*/true);
  const auto first = x.grad().to_vector<double>();
  x.set_grad(Tensor());
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), first);
}

TEST(Checkpoint, NoGradModeJustRunsTheFunction) {
  Tensor w = Tensor::from_vector<double>({2.0}).requires_grad_();
  NoGradGuard no_grad;
  Tensor y = checkpoint([&](const std::vector<Tensor>& in) { return in[0] * w; }, {Tensor::from_vector<double>({3.0})});
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.item(), 6.0);
}

TEST(Checkpoint, RefusesCapturedActivationsAndChangedControlFlow) {
  Tensor x = Tensor::from_vector<double>({1.0, 2.0}).requires_grad_();
  Tensor h = x * 2.0;  // requires grad, not a parameter
  try {
    (void)checkpoint([&](const std::vector<Tensor>& in) { return in[0] + h; }, {x});
    FAIL() << "a captured non-leaf was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("inputs"), std::string::npos) << e.what();
  }
  // One more dropout on the recompute than in the first run.
  nn::Dropout drop(0.5, 3);
  int runs = 0;
  Tensor y = checkpoint(
      [&](const std::vector<Tensor>& in) {
        Tensor t = drop.forward(in[0]);
        return ++runs > 1 ? drop.forward(t) : t;
      },
      {x});
  try {
    sum(y).backward();
    FAIL() << "a changed number of random draws was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("random"), std::string::npos) << e.what();
  }
}

TEST(AutogradGrad, ReturnsGradientsWithoutAccumulating) {
  Tensor a = Tensor::from_vector<double>({1.0, 2.0}).requires_grad_();
  Tensor b = Tensor::from_vector<double>({3.0, 4.0}).requires_grad_();
  Tensor c = Tensor::from_vector<double>({5.0, 6.0}).requires_grad_();
  Tensor y = sum(a * b + c);
  std::vector<Tensor> others;
  auto g = autograd::grad({y}, {Tensor::scalar(1.0, DType::F64)}, {a, b}, false, &others);
  EXPECT_EQ(g[0].to_vector<double>(), (std::vector<double>{3, 4}));
  EXPECT_EQ(g[1].to_vector<double>(), (std::vector<double>{1, 2}));
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(c.grad().defined());  // dropped, and listed
  ASSERT_EQ(others.size(), 1u);
  EXPECT_TRUE(others[0].is_same(c));
  EXPECT_THROW(autograd::grad({sum(a * 2.0)}, {Tensor::scalar(1.0, DType::F64)}, {a * 1.0}), Error);
}

}  // namespace checkpoint_test
}  // namespace kiln
