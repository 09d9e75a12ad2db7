// The pretrain-gpt LR schedules against Megatron-LM's OptimizerParamScheduler.get_lr. The expected
// values were computed by a Python transcription of that function (megatron/core/optimizer_param_scheduler.py)
// with lr_warmup_steps 10, lr_decay_steps 100, wsd_decay_steps 30, max_lr 3e-4, min_lr 3e-5, init_lr 0.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kiln/optim/lr_scheduler.h"
#include "kiln/runtime/error.h"

namespace kiln {
namespace gpt_lr_schedule_test {

struct MegatronCase {
  optim::DecayStyle style;
  optim::WsdDecayStyle wsd;
  std::vector<double> lr;  // at kSteps
};

const std::vector<std::int64_t> kSteps = {0, 1, 5, 10, 11, 37, 60, 70, 71, 80, 85, 99, 100, 101, 150};

TEST(GptLrSchedule, MatchesMegatronGetLr) {
  const std::vector<MegatronCase> cases = {
      {optim::DecayStyle::Cosine,
       optim::WsdDecayStyle::Exponential,
       {0.0, 2.9999999999999997e-05, 0.00015, 0.0003, 0.00029991776164757793, 0.00024435100905948387,
        0.0001415574960149644, 9.750000000000001e-05, 9.346089932851734e-05, 6.158400017893797e-05,
        4.808657048910077e-05, 3.0082238352422073e-05, 3e-05, 3e-05, 3e-05}},
      {optim::DecayStyle::Linear,
       optim::WsdDecayStyle::Exponential,
       {0.0, 2.9999999999999997e-05, 0.00015, 0.0003, 0.000297, 0.00021899999999999996, 0.00015, 0.00011999999999999999,
        0.00011699999999999997, 8.999999999999999e-05, 7.499999999999998e-05, 3.299999999999999e-05, 3e-05, 3e-05,
        3e-05}},
      {optim::DecayStyle::Constant,
       optim::WsdDecayStyle::Exponential,
       {0.0, 2.9999999999999997e-05, 0.00015, 0.0003, 0.0003, 0.0003, 0.0003, 0.0003, 0.0003, 0.0003, 0.0003, 0.0003,
        0.0003, 0.0003, 0.0003}},
      {optim::DecayStyle::WSD,
       optim::WsdDecayStyle::Exponential,
       {0.0, 2.9999999999999997e-05, 0.00015, 0.0003, 0.0003, 0.0003, 0.0003, 0.0003, 0.0002876663829544928,
        0.00018859828403141387, 0.00014183766184073566, 3.6310950839129244e-05, 3e-05, 3e-05, 3e-05}},
      {optim::DecayStyle::WSD,
       optim::WsdDecayStyle::Linear,
       {0.0, 2.9999999999999997e-05, 0.00015, 0.0003, 0.0003, 0.0003, 0.0003, 0.0003, 0.00029099999999999997,
        0.00020999999999999998, 0.00016499999999999997, 3.9e-05, 3e-05, 3e-05, 3e-05}},
      {optim::DecayStyle::WSD,
       optim::WsdDecayStyle::Cosine,
       {0.0, 2.9999999999999997e-05, 0.00015, 0.0003, 0.0003, 0.0003, 0.0003, 0.0003, 0.00029926045587471686,
        0.00023249999999999996, 0.00016499999999999997, 3.0739544125283105e-05, 3e-05, 3e-05, 3e-05}},
      {optim::DecayStyle::WSD,
       optim::WsdDecayStyle::MinusSqrt,
       {0.0, 2.9999999999999997e-05, 0.00015, 0.0003, 0.0003, 0.0003, 0.0003, 0.0003, 0.000250704969824535,
        0.00014411542731880103, 0.00010908116907963214, 3.4538138332452745e-05, 3e-05, 3e-05, 3e-05}},
  };
  for (const auto& c : cases) {
    optim::WarmupDecayOptions o;
    o.max_lr = 3e-4;
    o.min_lr = 3e-5;
    o.warmup_iters = 10;
    o.decay_iters = 100;
    o.style = c.style;
    o.wsd_decay_iters = 30;
    o.wsd_style = c.wsd;
    optim::WarmupDecayLR schedule(o);
    ASSERT_EQ(c.lr.size(), kSteps.size());
    for (std::size_t i = 0; i < kSteps.size(); ++i)
      EXPECT_NEAR(schedule.get_lr(kSteps[i]), c.lr[i], 1e-15)
          << "style " << static_cast<int>(c.style) << " wsd " << static_cast<int>(c.wsd) << " step " << kSteps[i];
  }
}

TEST(GptLrSchedule, WsdNeedsAnAnnealThatFits) {
  optim::WarmupDecayOptions o;
  o.max_lr = 1e-3;
  o.warmup_iters = 10;
  o.decay_iters = 100;
  o.style = optim::DecayStyle::WSD;
  o.wsd_decay_iters = 0;
  EXPECT_THROW(optim::WarmupDecayLR{o}, Error);
  o.wsd_decay_iters = 91;  // longer than decay - warmup
  EXPECT_THROW(optim::WarmupDecayLR{o}, Error);
  o.wsd_decay_iters = 90;
  EXPECT_NO_THROW(optim::WarmupDecayLR{o});
}

}  // namespace gpt_lr_schedule_test
}  // namespace kiln
