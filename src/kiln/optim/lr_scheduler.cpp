#include "kiln/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kiln::optim {

double LRSchedule::apply(Optimizer& optimizer, std::int64_t step) const {
  double lr = get_lr(step);
  optimizer.set_lr(lr);
  return lr;
}

StepLR::StepLR(double base_lr, std::int64_t step_size, double gamma)
    : base_lr_(base_lr), step_size_(step_size), gamma_(gamma) {
  KILN_CHECK(step_size > 0, "StepLR: step_size must be positive, got {}", step_size);
}

double StepLR::get_lr(std::int64_t step) const {
  return base_lr_ * std::pow(gamma_, static_cast<double>(std::max<std::int64_t>(step, 0) / step_size_));
}

LinearLR::LinearLR(double base_lr, double start_factor, double end_factor, std::int64_t total_iters)
    : base_lr_(base_lr), start_factor_(start_factor), end_factor_(end_factor), total_iters_(total_iters) {
  KILN_CHECK(start_factor > 0 && start_factor <= 1 && end_factor >= 0 && end_factor <= 1,
             "LinearLR: factors must be in (0, 1] and [0, 1], got {} and {}", start_factor, end_factor);
  KILN_CHECK(total_iters >= 0, "LinearLR: negative total_iters {}", total_iters);
}

double LinearLR::get_lr(std::int64_t step) const {
  if (total_iters_ == 0) return base_lr_ * end_factor_;
  double t = static_cast<double>(std::clamp<std::int64_t>(step, 0, total_iters_)) / static_cast<double>(total_iters_);
  return base_lr_ * (start_factor_ + (end_factor_ - start_factor_) * t);
}

CosineAnnealingLR::CosineAnnealingLR(double base_lr, std::int64_t t_max, double eta_min)
    : base_lr_(base_lr), t_max_(t_max), eta_min_(eta_min) {
  KILN_CHECK(t_max > 0, "CosineAnnealingLR: t_max must be positive, got {}", t_max);
}

double CosineAnnealingLR::get_lr(std::int64_t step) const {
  const double t = static_cast<double>(step) / static_cast<double>(t_max_);
  return eta_min_ + (base_lr_ - eta_min_) * (1 + std::cos(std::numbers::pi * t)) / 2;
}

WarmupDecayLR::WarmupDecayLR(WarmupDecayOptions options) : options_(options) {
  KILN_CHECK(options.warmup_iters >= 0, "WarmupDecayLR: negative warmup_iters {}", options.warmup_iters);
  KILN_CHECK(options.min_lr <= options.max_lr, "WarmupDecayLR: min_lr {} exceeds max_lr {}", options.min_lr,
             options.max_lr);
  KILN_CHECK(options.style == DecayStyle::Constant || options.style == DecayStyle::InverseSquareRoot ||
                 options.decay_iters > options.warmup_iters,
             "WarmupDecayLR: decay_iters ({}) must exceed warmup_iters ({})", options.decay_iters,
             options.warmup_iters);
  KILN_CHECK(options.style != DecayStyle::WSD ||
                 (options.wsd_decay_iters > 0 && options.wsd_decay_iters <= options.decay_iters - options.warmup_iters),
             "WarmupDecayLR: WSD needs wsd_decay_iters in 1..decay_iters - warmup_iters ({}), got {}",
             options.decay_iters - options.warmup_iters, options.wsd_decay_iters);
}

double WarmupDecayLR::get_lr(std::int64_t step) const {
  const auto& o = options_;
  if (o.warmup_iters > 0 && step <= o.warmup_iters)
    return o.init_lr + (o.max_lr - o.init_lr) * static_cast<double>(step) / static_cast<double>(o.warmup_iters);
  if (o.style == DecayStyle::Constant) return o.max_lr;
  if (o.style == DecayStyle::InverseSquareRoot) {
    const double warmup = static_cast<double>(std::max<std::int64_t>(o.warmup_iters, 1));
    const double s = static_cast<double>(std::max<std::int64_t>(step, 1));
    return std::max(o.min_lr, o.max_lr * std::sqrt(warmup) / std::sqrt(s));
  }
  if (step > o.decay_iters) return o.min_lr;
  const double ratio = static_cast<double>(step - o.warmup_iters) / static_cast<double>(o.decay_iters - o.warmup_iters);
  double coeff = 0;
  if (o.style == DecayStyle::Linear) {
    coeff = 1.0 - ratio;
  } else if (o.style == DecayStyle::Cosine) {
    coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  } else {  // WSD: stable at max_lr, then the anneal over the last wsd_decay_iters steps
    const std::int64_t anneal_start = o.decay_iters - o.wsd_decay_iters;
    if (step <= anneal_start) {
      coeff = 1.0;
    } else {
      const double r = static_cast<double>(step - anneal_start) / static_cast<double>(o.wsd_decay_iters);
      switch (o.wsd_style) {
        case WsdDecayStyle::Exponential: coeff = 2.0 * std::pow(0.5, r) - 1.0; break;
        case WsdDecayStyle::Linear: coeff = 1.0 - r; break;
        case WsdDecayStyle::Cosine: coeff = 0.5 * (std::cos(std::numbers::pi * r) + 1.0); break;
        case WsdDecayStyle::MinusSqrt: coeff = 1.0 - std::sqrt(r); break;
      }
    }
  }
  return o.min_lr + coeff * (o.max_lr - o.min_lr);
}

}  // namespace kiln::optim
