// A whole training step (forward, loss, backward, optimizer, on-device loss sum) captured once in
// a CUDA graph and replayed, against the same steps run eagerly: conv + batch norm + dropout +
// linear, Adam/AdamW/SGD in capturable mode, an LR schedule changing the rate between replays,
// and allocations between replays (the capture's private pool must keep its memory).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>

#include "kiln/autograd/functions.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optimizer.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/tensor/random_generator.h"
#if KILN_WITH_CUDA
#include "kiln/runtime/cuda/cuda_graph.h"
#endif
#include "test_util.h"

namespace kiln::cudatest {
namespace cuda_graph_training_test {

#if KILN_WITH_CUDA

constexpr int kBatch = 16, kSteps = 8, kWarmup = 2;

std::shared_ptr<nn::Sequential> make_model() {
  manual_seed(42);
  auto m = std::make_shared<nn::Sequential>();
  // No conv bias: batch norm right after cancels it, so its true gradient is zero and Adam's update
  // of it (lr * sign of rounding noise) would differ between any two summation orders.
  m->push_back(std::make_shared<nn::Conv2d>(3, 8, 3, nn::Conv2dOptions{.padding = 1, .bias = false}));
  m->push_back(std::make_shared<nn::BatchNorm2d>(8));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Dropout>(0.25, 7));
  m->push_back(std::make_shared<nn::Flatten>());
  m->push_back(std::make_shared<nn::Linear>(8 * 8 * 8, 10));
  m->to(gpu());
  m->train();
  return m;
}

using OptFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>, bool capturable)>;

double lr_at(int step) { return 0.01 * (1.0 + 0.5 * std::cos(0.7 * step)); }  // changes every step

struct Result {
  std::vector<std::vector<float>> params;
  double loss_sum = 0;
};

// kSteps steps on fixed batches. graph: the first kWarmup eagerly, then one captured step
// replayed. capturable: capturable optimizer + graph-safe dropout (always on with graph).
Result train(const OptFactory& make_opt, bool graph, bool capturable) {
  auto model = make_model();
  if (capturable) nn::set_graph_safe_random(*model);
  auto opt = make_opt(model->parameters(), capturable);
  Tensor x_static = Tensor::empty({kBatch, 3, 8, 8}, DType::F32, gpu());
  Tensor y_static = Tensor::empty({kBatch}, DType::I64, gpu());
  Tensor loss_sum = Tensor::zeros({}, DType::F32, gpu());
  auto step = [&] {
    Tensor loss = cross_entropy(model->forward(x_static), y_static);
    opt->zero_grad();
    loss.backward();
    opt->step();
    NoGradGuard no_grad;
    loss_sum.add_(loss.detach());
  };
  CudaGraph g;
  for (int s = 0; s < kSteps; ++s) {
    opt->set_lr(lr_at(s));
    x_static.copy_(randn({kBatch, 3, 8, 8}, 1000 + s, DType::F32));
    y_static.copy_(rand_int({kBatch}, 2000 + s, 0, 10));
    if (!graph || s < kWarmup) {
      step();
    } else if (!g.captured()) {
      g.capture_begin(gpu());
      step();
      g.capture_end();
      g.replay();
    } else {
      // Other work allocating between replays must not get the graph's memory.
      Tensor junk = Tensor::empty({1 << 16}, DType::F32, gpu());
      ops::fill(junk, std::nan(""));
      g.replay();
    }
  }
  synchronize(gpu());
  Result r;
  for (const Tensor& p : model->parameters()) r.params.push_back(p.to_vector<float>());
  r.loss_sum = loss_sum.item();
  return r;
}

void expect_close(const Result& a, const Result& b, double rel, const std::string& what) {
  ASSERT_EQ(a.params.size(), b.params.size());
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    ASSERT_EQ(a.params[i].size(), b.params[i].size());
    for (std::size_t k = 0; k < a.params[i].size(); ++k) {
      const double x = a.params[i][k], y = b.params[i][k];
      ASSERT_TRUE(std::isfinite(x)) << what << " param " << i << "[" << k << "]";
      ASSERT_NEAR(x, y, rel * std::max(1.0, std::fabs(y))) << what << " param " << i << "[" << k << "]";
    }
  }
  EXPECT_NEAR(a.loss_sum, b.loss_sum, rel * std::max(1.0, std::fabs(b.loss_sum))) << what << " loss sum";
}

void check(const OptFactory& make_opt, const std::string& name) {
  const Result eager = train(make_opt, false, true);
  const Result graphed = train(make_opt, true, true);
  // Same kernels, same memory contents: equal up to atomics' summation order in reductions.
  expect_close(graphed, eager, 1e-6, name + " graph vs eager (capturable)");
  // The plain eager path (host lr/step, host dropout offsets) differs only by pow() on the device.
  const Result plain = train(make_opt, false, false);
  expect_close(graphed, plain, 1e-5, name + " graph vs eager (host scalars)");
}

TEST(CudaGraphTraining, AdamStepReplaysLikeEager) {
  KILN_REQUIRE_CUDA();
  check(
      [](std::vector<Tensor> p, bool c) {
        return std::make_unique<optim::Adam>(std::move(p), optim::AdamOptions{.weight_decay = 1e-4, .capturable = c});
      },
      "Adam");
}

TEST(CudaGraphTraining, AdamWStepReplaysLikeEager) {
  KILN_REQUIRE_CUDA();
  check(
      [](std::vector<Tensor> p, bool c) {
        return std::make_unique<optim::AdamW>(std::move(p), optim::AdamOptions{.weight_decay = 0.05, .capturable = c});
      },
      "AdamW");
}

TEST(CudaGraphTraining, SgdStepReplaysLikeEager) {
  KILN_REQUIRE_CUDA();
  check(
      [](std::vector<Tensor> p, bool c) {
        return std::make_unique<optim::SGD>(std::move(p),
                                            optim::SGDOptions{.momentum = 0.9, .weight_decay = 1e-4, .capturable = c});
      },
      "SGD");
}

// The learning rate written between replays is the one the replay uses: 0 freezes the
// parameters, a positive rate moves them; the step count advances on the device.
TEST(CudaGraphTraining, LearningRateWrittenBetweenReplaysTakesEffect) {
  KILN_REQUIRE_CUDA();
  auto model = make_model();
  nn::set_graph_safe_random(*model);
  optim::Adam opt(model->parameters(), {.lr = 0.01, .capturable = true});
  Tensor x = on(randn({kBatch, 3, 8, 8}, 5, DType::F32), gpu());
  Tensor y = on(rand_int({kBatch}, 6, 0, 10), gpu());
  auto step = [&] {
    Tensor loss = cross_entropy(model->forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  };
  step();
  step();
  CudaGraph g;
  g.capture_begin(gpu());
  step();
  g.capture_end();
  auto snapshot = [&] {
    synchronize(gpu());
    std::vector<std::vector<float>> v;
    for (const Tensor& p : model->parameters()) v.push_back(p.to_vector<float>());
    return v;
  };
  opt.set_lr(0.0);
  auto before = snapshot();
  g.replay();
  g.replay();
  EXPECT_EQ(snapshot(), before) << "lr 0 between replays must freeze the parameters";
  opt.set_lr(0.05);
  g.replay();
  EXPECT_NE(snapshot(), before) << "a positive lr written between replays must move them";
  // Two eager steps and three replays (the capture itself ran nothing).
  EXPECT_EQ(opt.state_dict().at("state.0.step").item(), 5);
}

// Replays draw fresh dropout masks (the device offset advances inside the graph).
TEST(CudaGraphTraining, DropoutMaskChangesPerReplay) {
  KILN_REQUIRE_CUDA();
  nn::Dropout d(0.5, 3);
  d.graph_safe = true;
  d.train();
  Tensor x = Tensor::ones({4096}, DType::F32, gpu());
  Tensor out = Tensor::empty({4096}, DType::F32, gpu());
  NoGradGuard no_grad;
  out.copy_(d.forward(x));  // eager: creates the device counter
  CudaGraph g;
  g.capture_begin(gpu());
  out.copy_(d.forward(x));
  g.capture_end();
  g.replay();
  synchronize(gpu());
  const auto first = out.to_vector<float>();
  g.replay();
  synchronize(gpu());
  const auto second = out.to_vector<float>();
  EXPECT_NE(first, second);
  // They are the masks of calls 2 and 3 of the host-offset mode.
  nn::Dropout h(0.5, 3);
  h.train();
  Tensor xc = Tensor::ones({4096});
  h.forward(xc);
  EXPECT_EQ(h.forward(xc).to_vector<float>(), first);
  EXPECT_EQ(h.forward(xc).to_vector<float>(), second);
}

#endif  // KILN_WITH_CUDA

}  // namespace cuda_graph_training_test
}  // namespace kiln::cudatest
