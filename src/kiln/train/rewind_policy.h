#pragma once
// RewindPolicy: what a trainer does when AnomalyDetector flags a step: roll back to the last good
// state (an in-memory host snapshot taken every snapshot_interval steps, else the last checkpoint),
// add the batch that caused it to the skip list (saved in every checkpoint, so a rerun or a resume
// skips the same batches), optionally train on at a lower learning rate for a while, and give up,
// with a report of every rewind, when more than max_rewinds happen within max_rewinds_window steps
// (the state itself is bad, not a batch).
//
// API (train-cifar10 now, pretrain-gpt at merge):
//   RewindPolicy policy(options);                 // options from the --rewind-* flags
//   if (policy.snapshot_due(step)) take a snapshot (train-cifar10: at epoch starts too);
//   on an anomaly at step s: policy.record({s, anomaly, ...}) (throws the report past the budget),
//     restore, skip.insert(s), continue from the snapshot's step;
//   each step: lr = schedule(step) * policy.lr_scale(step);
//   judge steps in batches to avoid a sync per step: keep each step's loss and squared gradient norm
//     in a device ring of snapshot_interval slots and read it at snapshot points, before saves and
//     at the end (train-cifar10 does; the rewind goes back to the snapshot either way);
//   events go to the log, events.jsonl (rewind_event_json) and TensorBoard (rewind/count).
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "kiln/train/anomaly_detector.h"

namespace kiln::train {

struct RewindOptions {
  bool enabled = false;
  AnomalyThresholds thresholds;
  int snapshot_interval = 50;     // steps between in-memory snapshots (0: rewind to the last checkpoint)
  int max_rewinds = 5;            // give up at the rewind after this many ...
  int max_rewinds_window = 1000;  // ... within this many steps
  double lr_factor = 1.0;         // after a rewind, the learning rate is multiplied by this ...
  int lr_steps = 0;               // ... for this many steps (0: not lowered)
};

// Checks the options, each error naming its flag.
void check_rewind_options(const RewindOptions& o);

struct RewindEvent {
  std::int64_t step = 0;  // the step that went wrong (its batch is skipped from now on)
  Anomaly anomaly;
  double loss = 0, grad_norm = 0;
  std::int64_t restored_to = 0;  // the step the state was rolled back to (training resumes after it)
  std::string source;            // "memory snapshot" or the checkpoint's folder
};

class RewindPolicy {
 public:
  explicit RewindPolicy(RewindOptions options);
  const RewindOptions& options() const { return options_; }
  bool snapshot_due(std::int64_t steps_done) const;
  // Records a rewind; throws, with report(), when it exceeds the budget.
  void record(const RewindEvent& event);
  // The learning-rate multiplier at `step` (lr_factor within lr_steps after the last rewind).
  double lr_scale(std::int64_t step) const;
  const std::vector<RewindEvent>& events() const { return events_; }
  // One line per rewind: "step 12 (nonfinite_loss: the loss is nan) -> rolled back to step 10 (memory snapshot)".
  std::string report() const;

 private:
  RewindOptions options_;
  std::vector<RewindEvent> events_;
  std::int64_t lowered_from_ = -1, lowered_until_ = -1;
};

nlohmann::json rewind_event_json(const RewindEvent& event);

// Skip lists as text: "5,17,230" (sorted, no spaces); parse_skip_list accepts that form (and
// spaces), naming `what` (a flag or a checkpoint) in its errors.
std::string skip_list_text(const std::set<std::int64_t>& steps);
std::set<std::int64_t> parse_skip_list(const std::string& text, const std::string& what);

}  // namespace kiln::train
