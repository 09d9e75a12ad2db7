#pragma once
// Learning-rate schedules as pure functions of the step: get_lr(step) has no state, so resuming
// needs only the step. apply(opt, step) sets every group's lr to get_lr(step) * lr_mult.
//
//   optim::WarmupDecayLR sched({.max_lr = 3e-4, .min_lr = 3e-5, .warmup_iters = 100,
//                               .decay_iters = 10000, .style = optim::DecayStyle::Cosine});
//   for (int64_t it = 0; it < iters; ++it) { sched.apply(opt, it); ...; opt.step(); }
#include <cstdint>

#include "kiln/optim/optimizer.h"

namespace kiln::optim {

class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  virtual double get_lr(std::int64_t step) const = 0;
  double apply(Optimizer& optimizer, std::int64_t step) const;  // returns get_lr(step)
};

// Constant lr.
class ConstantLR : public LRSchedule {
 public:
  explicit ConstantLR(double lr) : lr_(lr) {}
  double get_lr(std::int64_t) const override { return lr_; }

 private:
  double lr_;
};

// torch StepLR: base_lr * gamma^(step / step_size).
class StepLR : public LRSchedule {
 public:
  StepLR(double base_lr, std::int64_t step_size, double gamma = 0.1);
  double get_lr(std::int64_t step) const override;

 private:
  double base_lr_;
  std::int64_t step_size_;
  double gamma_;
};

// torch LinearLR: base_lr * factor, the factor going linearly from start_factor to end_factor
// over total_iters steps and staying at end_factor after.
class LinearLR : public LRSchedule {
 public:
  LinearLR(double base_lr, double start_factor = 1.0 / 3.0, double end_factor = 1.0, std::int64_t total_iters = 5);
  double get_lr(std::int64_t step) const override;

 private:
  double base_lr_, start_factor_, end_factor_;
  std::int64_t total_iters_;
};

// torch CosineAnnealingLR (closed form): eta_min + (base_lr - eta_min) (1 + cos(pi step / t_max)) / 2.
class CosineAnnealingLR : public LRSchedule {
 public:
  CosineAnnealingLR(double base_lr, std::int64_t t_max, double eta_min = 0);
  double get_lr(std::int64_t step) const override;

 private:
  double base_lr_;
  std::int64_t t_max_;
  double eta_min_;
};

enum class DecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };
// The anneal of WSD (warmup-stable-decay), Megatron's --lr-wsd-decay-style.
enum class WsdDecayStyle { Exponential, Linear, Cosine, MinusSqrt };

struct WarmupDecayOptions {
  double max_lr = 1e-3;
  double min_lr = 0;
  std::int64_t warmup_iters = 0;
  std::int64_t decay_iters = 0;  // the step at which the decay ends (counted from 0, warmup included)
  DecayStyle style = DecayStyle::Cosine;
  double init_lr = 0;  // the lr at step 0 of the warmup
  // WSD: the last wsd_decay_iters steps before decay_iters anneal from max_lr to min_lr in
  // wsd_style; the steps between the warmup and them hold max_lr.
  std::int64_t wsd_decay_iters = 0;
  WsdDecayStyle wsd_style = WsdDecayStyle::Exponential;
};

// Megatron's OptimizerParamScheduler.get_lr: a linear warmup from init_lr to max_lr over
// warmup_iters steps (step <= warmup_iters), then a decay to min_lr reached at decay_iters
// (linear: 1 - r, cosine: (1 + cos(pi r)) / 2, r = (step - warmup) / (decay - warmup)), then
// min_lr. InverseSquareRoot: max_lr sqrt(warmup) / sqrt(step), at least min_lr. WSD: max_lr
// until decay_iters - wsd_decay_iters, then with r = (step - that) / wsd_decay_iters the
// coefficient 2 * 0.5^r - 1 (exponential), 1 - r (linear), (1 + cos(pi r)) / 2 (cosine) or
// 1 - sqrt(r) (minus_sqrt) of (max_lr - min_lr) above min_lr.
class WarmupDecayLR : public LRSchedule {
 public:
  explicit WarmupDecayLR(WarmupDecayOptions options);
  double get_lr(std::int64_t step) const override;
  const WarmupDecayOptions& options() const { return options_; }

 private:
  WarmupDecayOptions options_;
};

}  // namespace kiln::optim
