// The training loop of docs/nn.md, end to end: a small MLP fits a smooth function with AdamW, a
// warmup-cosine schedule, gradient clipping and bf16 autocast; then the model and optimizer are
// checkpointed and restored.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "kiln/autograd/functions.h"
#include "kiln/io/safetensors.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/clip_grad.h"
#include "kiln/optim/lr_scheduler.h"
#include "kiln/optim/optimizer.h"
#include "kiln/tensor/autocast.h"

namespace kiln {
namespace training_loop_test {

TEST(TrainingLoop, MlpFitsWithAdamWScheduleClippingAndAutocast) {
  const Device device = Device::cpu();
  manual_seed(0);
  Tensor x = Tensor::rand({64, 4}, 1) * 2.0 - 1.0;
  Tensor y = sum(sin(x * 2.0), {1}, true);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<nn::Linear>(4, 32), std::make_shared<nn::GELU>(), std::make_shared<nn::Linear>(32, 1)});
  model->to(device);
  optim::AdamW opt(model->parameters(), {.lr = 1e-2, .weight_decay = 0.01});
  optim::WarmupDecayLR schedule({.max_lr = 1e-2, .min_lr = 1e-3, .warmup_iters = 10, .decay_iters = 200});
  double first = 0, last = 0;
  for (std::int64_t it = 0; it < 200; ++it) {
    schedule.apply(opt, it);
    Tensor loss;
    {
      AutocastGuard autocast(DType::BF16);
      Tensor pred = model->forward(x).to(DType::F32);
      loss = mean(square(pred - y));
    }
    opt.zero_grad();
    loss.backward();
    Tensor norm = optim::clip_grad_norm_(model->parameters(), 1.0);
    EXPECT_TRUE(std::isfinite(norm.item()));
    opt.step();
    if (it == 0) first = loss.item();
    last = loss.item();
  }
  EXPECT_LT(last, 0.2 * first) << "first " << first << " last " << last;

  std::string dir = std::filesystem::temp_directory_path().string();
  model->save(dir + "/kiln_loop_model.safetensors");
  io::save_safetensors(dir + "/kiln_loop_optim.safetensors", opt.state_dict());
  manual_seed(1);
  auto copy = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<nn::Linear>(4, 32), std::make_shared<nn::GELU>(), std::make_shared<nn::Linear>(32, 1)});
  copy->load(dir + "/kiln_loop_model.safetensors");
  optim::AdamW opt2(copy->parameters(), {.lr = 1e-2, .weight_decay = 0.01});
  opt2.load_state_dict(io::load_safetensors(dir + "/kiln_loop_optim.safetensors").tensors);
  EXPECT_EQ(copy->forward(x).to_vector<float>(), model->forward(x).to_vector<float>());
  EXPECT_DOUBLE_EQ(opt2.lr(), opt.lr());
  std::filesystem::remove(dir + "/kiln_loop_model.safetensors");
  std::filesystem::remove(dir + "/kiln_loop_optim.safetensors");
}

}  // namespace training_loop_test
}  // namespace kiln
