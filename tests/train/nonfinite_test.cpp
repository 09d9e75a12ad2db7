// A diverged run stops with an error naming the step, instead of reporting finite losses and
// saving NaN weights.
#include <cmath>
#include <limits>

#include "kiln/autograd/functions.h"
#include "kiln/train/nonfinite_guard.h"
#include "train_test_util.h"

namespace kiln::train::testing {
namespace nonfinite_test {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A parameter with gradient `g`.
Tensor param_with_grad(double g) {
  Tensor p = Tensor::from_vector<float>({1.0f, 2.0f}, {2});
  p.requires_grad_(true);
  sum(mul(p, Tensor::from_vector<float>({1.0f, static_cast<float>(g)}, {2}))).backward();
  return p;
}

TEST(NonFiniteGuard, NamesTheFirstBadStep) {
  NonFiniteGuard guard(Device::cpu());
  std::vector<Tensor> fine = {param_with_grad(3)};
  guard.record(Tensor::scalar(1.5), fine);
  guard.record(Tensor::scalar(0.5), fine);
  EXPECT_FALSE(guard.first_bad_step().has_value());
  guard.record(Tensor::scalar(kNaN), fine);  // step 3: the loss
  guard.record(Tensor::scalar(1.0), fine);
  guard.record(Tensor::scalar(kInf), fine);  // a later bad step does not move it
  ASSERT_TRUE(guard.first_bad_step().has_value());
  EXPECT_EQ(*guard.first_bad_step(), 3);
}

TEST(NonFiniteGuard, SeesGradientsTheLossDoesNotShow) {
  for (double g : {kNaN, kInf, -kInf}) {
    NonFiniteGuard guard(Device::cpu());
    guard.record(Tensor::scalar(1.0), {param_with_grad(1)});
    guard.record(Tensor::scalar(1.0), {param_with_grad(1), param_with_grad(g)});
    ASSERT_TRUE(guard.first_bad_step().has_value()) << g;
    EXPECT_EQ(*guard.first_bad_step(), 2) << g;
  }
}

TEST(NonFiniteGuard, ParametersWithoutGradientsAreSkipped) {
  NonFiniteGuard guard(Device::cpu());
  Tensor no_grad = Tensor::from_vector<float>({1.0f});
  guard.record(Tensor::scalar(2.0), {no_grad});
  EXPECT_FALSE(guard.first_bad_step().has_value());
}

TEST(Divergence, TrainingStopsNamingTheStepAndSavesNothing) {
  const fs::path run = scratch_dir() / "run";
  ImageClassifierOptions o = quick_options(run, 2);
  o.lr = 1e30;  // the first update throws the weights to ~1e30: the next step's logits overflow
  const std::string error = error_of([&] { train_image_classifier(o); });
  EXPECT_CONTAINS(error, "training diverged at step ");
  EXPECT_CONTAINS(error, "(epoch 1, batch ");
  EXPECT_CONTAINS(error, "the loss or the gradients are not finite");
  EXPECT_CONTAINS(error, "no checkpoint was written");
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "latest.safetensors"));
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "best.safetensors"));
}

}  // namespace nonfinite_test
}  // namespace kiln::train::testing
