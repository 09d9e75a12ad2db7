#pragma once
// AnomalyDetector: decides, from a step's loss and gradient norm (host numbers), whether the step
// went wrong and must be undone: a NaN or inf loss or gradient norm, a loss spike (z-score above a
// threshold over a window of the recent good losses, or a ratio to their median), a gradient-norm
// spike (a ratio to the median of the recent good norms). Only accepted (good) steps enter the
// windows, so a spike does not raise the bar for the next one. Pure host arithmetic on two
// numbers per step; the trainer reads them from the device where it synchronises.
//
// API (train-cifar10 now, pretrain-gpt at merge):
//   AnomalyDetector d(thresholds);
//   if (auto a = d.check(loss, grad_norm)) rewind(*a); else d.accept(loss, grad_norm);
#include <deque>
#include <optional>
#include <string>

namespace kiln::train {

struct AnomalyThresholds {
  int window = 50;              // recent good steps the statistics are over
  int min_history = 10;         // spikes are judged only once this many good steps are known
  double loss_zscore = 6.0;     // loss > mean + z * std of the window (0: off)
  double loss_ratio = 0.0;      // loss > ratio * median of the window (0: off)
  double grad_norm_ratio = 10;  // grad norm > ratio * median of the window (0: off)
};

struct Anomaly {
  std::string kind;    // nonfinite_loss, nonfinite_grad_norm, loss_spike, grad_norm_spike
  std::string detail;  // "loss 231.4 is 812.3 standard deviations above the mean 2.21 of the last 50 steps"
};

class AnomalyDetector {
 public:
  explicit AnomalyDetector(AnomalyThresholds thresholds = {});
  std::optional<Anomaly> check(double loss, double grad_norm) const;
  void accept(double loss, double grad_norm);
  const AnomalyThresholds& thresholds() const { return thresholds_; }

 private:
  AnomalyThresholds thresholds_;
  std::deque<double> losses_, grad_norms_;
};

// Checks thresholds, naming the flag: e.g. "--rewind-window must be >= 2, got 1".
void check_anomaly_thresholds(const AnomalyThresholds& t);

}  // namespace kiln::train
