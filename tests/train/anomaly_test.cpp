// AnomalyDetector and RewindPolicy: what counts as a step gone wrong, and when rewinding stops.
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "kiln/train/anomaly_detector.h"
#include "kiln/train/rewind_policy.h"
#include "train_test_util.h"

namespace kiln::train::testing {
namespace anomaly_test {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A loss falling from 2.3 with some noise, gradient norms around 1: a healthy start of training.
AnomalyDetector warmed_up(AnomalyThresholds t = {}, int steps = 40) {
  AnomalyDetector d(t);
  for (int i = 0; i < steps; ++i) {
    const double loss = 2.3 * std::exp(-0.02 * i) + 0.05 * std::sin(i * 1.7);
    const double grad = 1.0 + 0.3 * std::cos(i * 0.9);
    EXPECT_FALSE(d.check(loss, grad).has_value()) << "step " << i;
    d.accept(loss, grad);
  }
  return d;
}

TEST(AnomalyDetector, NonFiniteLossOrGradientNormIsAlwaysAnAnomaly) {
  AnomalyDetector fresh;
  EXPECT_EQ(fresh.check(kNaN, 1.0)->kind, "nonfinite_loss");
  EXPECT_EQ(fresh.check(kInf, 1.0)->kind, "nonfinite_loss");
  EXPECT_EQ(fresh.check(1.0, kNaN)->kind, "nonfinite_grad_norm");
  EXPECT_EQ(fresh.check(1.0, kInf)->kind, "nonfinite_grad_norm");
  EXPECT_FALSE(fresh.check(1e6, 1e6).has_value()) << "no history yet: no spike can be judged";
}

TEST(AnomalyDetector, ALossSpikeByZScore) {
  AnomalyDetector d = warmed_up();
  auto a = d.check(20.0, 1.0);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, "loss_spike");
  EXPECT_CONTAINS(a->detail, "standard deviations above the mean");
  EXPECT_CONTAINS(a->detail, "--rewind-loss-zscore 6");
  EXPECT_FALSE(d.check(1.0, 1.0).has_value()) << "a low loss is never a spike";
}

TEST(AnomalyDetector, ALossSpikeByRatioToTheMedian) {
  AnomalyThresholds t;
  t.loss_zscore = 0;
  t.loss_ratio = 3;
  AnomalyDetector d = warmed_up(t);
  EXPECT_FALSE(d.check(2.0, 1.0).has_value());
  auto a = d.check(10.0, 1.0);
  ASSERT_TRUE(a);
  EXPECT_CONTAINS(a->detail, "times the median");
}

TEST(AnomalyDetector, AGradientNormSpike) {
  AnomalyDetector d = warmed_up();
  EXPECT_FALSE(d.check(1.5, 5.0).has_value());
  auto a = d.check(1.5, 50.0);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, "grad_norm_spike");
  EXPECT_CONTAINS(a->detail, "--rewind-grad-norm-ratio 10");
}

TEST(AnomalyDetector, OnlyAcceptedStepsEnterTheWindow) {
  AnomalyDetector d = warmed_up();
  ASSERT_TRUE(d.check(20.0, 1.0));
  // Not accepted: the same spike is still one.
  EXPECT_TRUE(d.check(20.0, 1.0));
}

TEST(AnomalyDetector, ThresholdsAreCheckedNamingTheFlag) {
  AnomalyThresholds t;
  t.window = 1;
  EXPECT_CONTAINS(error_of([&] { AnomalyDetector d(t); }), "--rewind-window must be >= 2");
  t = {};
  t.loss_ratio = 0.5;
  EXPECT_CONTAINS(error_of([&] { AnomalyDetector d(t); }), "--rewind-loss-ratio must be above 1");
  t = {};
  t.min_history = 100;
  EXPECT_CONTAINS(error_of([&] { AnomalyDetector d(t); }), "--rewind-min-history must be from 2 to");
}

RewindEvent event(std::int64_t step) {
  return {step, {"loss_spike", "loss 20 is 9 standard deviations above"}, 20.0, 1.0, step - 3, "memory snapshot"};
}

TEST(RewindPolicy, GivesUpPastTheBudgetWithAReport) {
  RewindOptions o;
  o.enabled = true;
  o.max_rewinds = 2;
  o.max_rewinds_window = 100;
  RewindPolicy p(o);
  p.record(event(10));
  p.record(event(50));
  const std::string error = error_of([&] { p.record(event(90)); });
  EXPECT_CONTAINS(error, "giving up: 3 rewinds within 100 steps (--rewind-max 2 in --rewind-max-window 100)");
  EXPECT_CONTAINS(error, "step 10 (loss_spike: loss 20 is 9 standard deviations above) -> rolled back to step 7");
  EXPECT_CONTAINS(error, "step 90");
  // Rewinds far apart are within the budget.
  RewindPolicy q(o);
  q.record(event(10));
  q.record(event(200));
  q.record(event(400));
  EXPECT_EQ(q.events().size(), 3u);
}

TEST(RewindPolicy, LowersTheLearningRateForAWhileAfterARewind) {
  RewindOptions o;
  o.lr_factor = 0.5;
  o.lr_steps = 4;
  RewindPolicy p(o);
  EXPECT_EQ(p.lr_scale(5), 1.0);
  p.record(event(13));  // rolled back to 10: steps 11..14 at half the rate
  EXPECT_EQ(p.lr_scale(10), 1.0);
  EXPECT_EQ(p.lr_scale(11), 0.5);
  EXPECT_EQ(p.lr_scale(14), 0.5);
  EXPECT_EQ(p.lr_scale(15), 1.0);
}

TEST(RewindPolicy, EventsAsJson) {
  RewindEvent e = event(12);
  e.loss = kNaN;
  nlohmann::json j = rewind_event_json(e);
  EXPECT_EQ(j["event"], "rewind");
  EXPECT_EQ(j["step"], 12);
  EXPECT_EQ(j["restored_to"], 9);
  EXPECT_EQ(j["skipped_batch"], 12);
  EXPECT_TRUE(j["loss"].is_null()) << "JSON has no NaN";
}

TEST(RewindPolicy, SkipLists) {
  EXPECT_EQ(skip_list_text({30, 4, 17}), "4,17,30");
  EXPECT_EQ(parse_skip_list("4, 17,30", "--skip-batches"), (std::set<std::int64_t>{4, 17, 30}));
  EXPECT_TRUE(parse_skip_list("", "--skip-batches").empty());
  EXPECT_CONTAINS(error_of([] { parse_skip_list("4,x", "--skip-batches"); }),
                  "--skip-batches: 'x' is not a step number >= 1");
  EXPECT_CONTAINS(error_of([] { parse_skip_list("0", "--skip-batches"); }), "'0' is not a step number");
}

TEST(RewindPolicy, OptionsAreCheckedNamingTheFlag) {
  RewindOptions o;
  o.lr_factor = 2;
  EXPECT_CONTAINS(error_of([&] { RewindPolicy p(o); }), "--rewind-lr-factor must be a number in (0, 1]");
  o = {};
  o.max_rewinds = 0;
  EXPECT_CONTAINS(error_of([&] { RewindPolicy p(o); }), "--rewind-max must be >= 1");
}

}  // namespace anomaly_test
}  // namespace kiln::train::testing
