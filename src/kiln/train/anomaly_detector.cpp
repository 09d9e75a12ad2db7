#include "kiln/train/anomaly_detector.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/runtime/error.h"

namespace kiln::train {

namespace {

double median(const std::deque<double>& values) {
  std::vector<double> v(values.begin(), values.end());
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (v.size() % 2) return *mid;
  return (*mid + *std::max_element(v.begin(), mid)) / 2;
}

void push(std::deque<double>& window, double value, int size) {
  window.push_back(value);
  while (static_cast<int>(window.size()) > size) window.pop_front();
}

}  // namespace

void check_anomaly_thresholds(const AnomalyThresholds& t) {
  KILN_CHECK(t.window >= 2, "--rewind-window must be >= 2 steps, got {}", t.window);
  KILN_CHECK(t.min_history >= 2 && t.min_history <= t.window,
             "--rewind-min-history must be from 2 to --rewind-window ({}), got {}", t.window, t.min_history);
  for (auto [flag, v] :
       {std::pair{"--rewind-loss-zscore", t.loss_zscore}, std::pair{"--rewind-loss-ratio", t.loss_ratio},
        std::pair{"--rewind-grad-norm-ratio", t.grad_norm_ratio}})
    KILN_CHECK(std::isfinite(v) && v >= 0, "{} must be a number >= 0 (0: off), got {}", flag, v);
  KILN_CHECK(t.loss_ratio == 0 || t.loss_ratio > 1, "--rewind-loss-ratio must be above 1 (or 0: off), got {}",
             t.loss_ratio);
  KILN_CHECK(t.grad_norm_ratio == 0 || t.grad_norm_ratio > 1,
             "--rewind-grad-norm-ratio must be above 1 (or 0: off), got {}", t.grad_norm_ratio);
}

AnomalyDetector::AnomalyDetector(AnomalyThresholds thresholds) : thresholds_(thresholds) {
  check_anomaly_thresholds(thresholds_);
}

std::optional<Anomaly> AnomalyDetector::check(double loss, double grad_norm) const {
  if (!std::isfinite(loss)) return Anomaly{"nonfinite_loss", fmt::format("the loss is {}", loss)};
  if (!std::isfinite(grad_norm))
    return Anomaly{"nonfinite_grad_norm",
                   fmt::format("the gradient norm is {} (a gradient holds NaN or inf)", grad_norm)};
  const int n = static_cast<int>(losses_.size());
  if (n < thresholds_.min_history) return std::nullopt;
  if (thresholds_.loss_zscore > 0) {
    double mean = 0;
    for (double l : losses_) mean += l;
    mean /= n;
    double var = 0;
    for (double l : losses_) var += (l - mean) * (l - mean);
    // A floor under the spread: a window of near-equal losses must not call a wobble a spike.
    const double std = std::max(std::sqrt(var / (n - 1)), 1e-3 * std::abs(mean) + 1e-12);
    const double z = (loss - mean) / std;
    if (z > thresholds_.loss_zscore)
      return Anomaly{"loss_spike",
                     fmt::format("loss {:.6g} is {:.1f} standard deviations above the mean {:.6g} of the last {} steps "
                                 "(--rewind-loss-zscore {})",
                                 loss, z, mean, n, thresholds_.loss_zscore)};
  }
  if (thresholds_.loss_ratio > 0) {
    const double m = median(losses_);
    if (loss > thresholds_.loss_ratio * m)
      return Anomaly{"loss_spike", fmt::format("loss {:.6g} is {:.1f} times the median {:.6g} of the last {} steps "
                                               "(--rewind-loss-ratio {})",
                                               loss, loss / m, m, n, thresholds_.loss_ratio)};
  }
  if (thresholds_.grad_norm_ratio > 0) {
    const double m = median(grad_norms_);
    if (grad_norm > thresholds_.grad_norm_ratio * m)
      return Anomaly{"grad_norm_spike",
                     fmt::format("gradient norm {:.6g} is {:.1f} times the median {:.6g} of the last {} steps "
                                 "(--rewind-grad-norm-ratio {})",
                                 grad_norm, grad_norm / m, m, n, thresholds_.grad_norm_ratio)};
  }
  return std::nullopt;
}

void AnomalyDetector::accept(double loss, double grad_norm) {
  push(losses_, loss, thresholds_.window);
  push(grad_norms_, grad_norm, thresholds_.window);
}

}  // namespace kiln::train
