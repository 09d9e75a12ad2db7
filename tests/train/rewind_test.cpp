// train-cifar10 with --rewind, step checkpoints and injected faults: a rewound run ends exactly
// where a clean run that skipped the same batches ends; a resume from a mid-epoch checkpoint is
// bit-identical to not stopping; a full disk and a damaged checkpoint lose nothing.
#include <nlohmann/json.hpp>

#include "kiln/io/safetensors.h"
#include "kiln/train/checkpoint_store.h"
#include "kiln/train/fault_injection.h"
#include "train_test_util.h"

namespace kiln::train::testing {
namespace rewind_test {

class Rewind : public ::testing::Test {
 protected:
  void TearDown() override { set_fault_plan_for_testing(""); }
};

// 32 steps of 8 images per epoch, two epochs: enough steps for the spike statistics.
ImageClassifierOptions rewind_options(const fs::path& out_dir) {
  ImageClassifierOptions o = quick_options(out_dir, 2);
  o.batch_size = 8;
  o.limit_train = 256;
  o.rewind.snapshot_interval = 8;
  return o;
}

// The trained tensors of a run's newest checkpoint (latest.safetensors or the store's).
TensorDict final_tensors(const fs::path& run) {
  if (fs::exists(run / "checkpoints" / "latest.safetensors"))
    return io::load_safetensors((run / "checkpoints" / "latest.safetensors").string()).tensors;
  CheckpointStore store(run / "checkpoints");
  auto c = store.load_newest_intact();
  EXPECT_TRUE(c);
  TensorDict all;
  for (const auto& [file, tensors] : c->files)
    for (const auto& [name, t] : tensors) all.insert(name, t);
  return all;
}

void expect_same_tensors(const TensorDict& a, const TensorDict& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.contains(name)) << name;
    EXPECT_EQ(t.to_vector<double>(), b.at(name).to_vector<double>()) << name;
  }
}

std::vector<nlohmann::json> events_of(const fs::path& run, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run / "events.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == kind) out.push_back(j);
  }
  return out;
}

void expect_rewind_equals_clean_skip(const std::string& fault, std::int64_t step, const std::string& kind) {
  const fs::path dir = scratch_dir();
  ImageClassifierOptions o = rewind_options(dir / "rewound");
  o.rewind.enabled = true;
  set_fault_plan_for_testing(fault);
  ::testing::internal::CaptureStdout();
  TrainingSummary rewound = train_image_classifier(o);
  const std::string out = ::testing::internal::GetCapturedStdout();
  set_fault_plan_for_testing("");
  ASSERT_GE(rewound.rewinds.size(), 1u) << out;
  EXPECT_EQ(rewound.rewinds[0].step, step);
  EXPECT_EQ(rewound.rewinds[0].anomaly.kind, kind);
  EXPECT_EQ(rewound.rewinds[0].restored_to, (step - 1) / 8 * 8) << "the last snapshot before the step";
  EXPECT_TRUE(rewound.skipped_batches.contains(step));
  EXPECT_CONTAINS(out, fmt::format("rewind at step {}", step));
  EXPECT_CONTAINS(out, fmt::format("batch {} is skipped from now on", step));
  auto logged = events_of(dir / "rewound", "rewind");
  ASSERT_EQ(logged.size(), rewound.rewinds.size());
  EXPECT_EQ(logged[0]["kind"], kind);
  EXPECT_EQ(logged[0]["skipped_batch"], step);

  ImageClassifierOptions c = rewind_options(dir / "clean");
  c.skip_batches = rewound.skipped_batches;
  TrainingSummary clean = train_image_classifier(c);
  ASSERT_EQ(clean.epochs.size(), rewound.epochs.size());
  for (std::size_t e = 0; e < clean.epochs.size(); ++e) {
    EXPECT_EQ(rewound.epochs[e].train_loss, clean.epochs[e].train_loss) << "epoch " << e + 1;
    EXPECT_EQ(rewound.epochs[e].val_loss, clean.epochs[e].val_loss) << "epoch " << e + 1;
  }
  expect_same_tensors(final_tensors(dir / "rewound"), final_tensors(dir / "clean"));
  // And not merely equal to any run: training on the batch gives another result.
  ImageClassifierOptions all = rewind_options(dir / "all_batches");
  EXPECT_NE(train_image_classifier(all).epochs.back().train_loss, clean.epochs.back().train_loss);
}

TEST_F(Rewind, AnInjectedNaNIsRolledBackAndEndsAsACleanRunSkippingItsBatch) {
  expect_rewind_equals_clean_skip("nan_loss@20", 20, "nonfinite_loss");
}

TEST_F(Rewind, AnInjectedSpikeIsRolledBackAndEndsAsACleanRunSkippingItsBatch) {
  expect_rewind_equals_clean_skip("spike@45", 45, "loss_spike");
}

TEST_F(Rewind, WithoutRewindANaNStillStopsTheRun) {
  ImageClassifierOptions o = rewind_options(scratch_dir() / "run");
  set_fault_plan_for_testing("nan_loss@5");
  ::testing::internal::CaptureStdout();
  const std::string error = error_of([&] { train_image_classifier(o); });
  ::testing::internal::GetCapturedStdout();
  EXPECT_CONTAINS(error, "training diverged at step 5 (epoch 1, batch 5 of 32)");
}

// The ring is judged every 8 steps: the NaN at step 3 is found at step 8 and rolled back to 0, the
// one at 10 at step 16 (back to 8), the one at 20 at step 24: the third rewind in the window.
TEST_F(Rewind, GivesUpWithAReportWhenRewindsKeepComing) {
  ImageClassifierOptions o = rewind_options(scratch_dir() / "run");
  o.rewind.enabled = true;
  o.rewind.max_rewinds = 2;
  o.rewind.thresholds.grad_norm_ratio = 0;  // only the injected NaNs count here
  set_fault_plan_for_testing("nan_loss@3,nan_loss@10,nan_loss@20");
  ::testing::internal::CaptureStdout();
  const std::string error = error_of([&] { train_image_classifier(o); });
  ::testing::internal::GetCapturedStdout();
  EXPECT_CONTAINS(error, "giving up: 3 rewinds within 1000 steps");
  EXPECT_CONTAINS(error, "step 3 (nonfinite_loss: the loss is nan) -> rolled back to step 0 (memory snapshot)");
  EXPECT_CONTAINS(error, "step 10 (nonfinite_loss: the loss is nan) -> rolled back to step 8 (memory snapshot)");
  EXPECT_CONTAINS(error, "step 20 (nonfinite_loss: the loss is nan) -> rolled back to step 16");
}

TEST_F(Rewind, TheSkipListTravelsInTheCheckpoint) {
  const fs::path run = scratch_dir() / "run";
  ImageClassifierOptions o = rewind_options(run);
  o.epochs = 1;
  o.save_interval = 10;
  o.rewind.enabled = true;
  set_fault_plan_for_testing("nan_loss@4");
  ::testing::internal::CaptureStdout();
  train_image_classifier(o);
  ::testing::internal::GetCapturedStdout();
  CheckpointStore store(run / "checkpoints");
  auto c = store.load_newest_intact();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->iteration, 32);
  EXPECT_EQ(c->metadata.at("skipped_batches"), "4");
  set_fault_plan_for_testing("");
  o.epochs = 2;
  o.resume = true;
  ::testing::internal::CaptureStdout();
  TrainingSummary s = train_image_classifier(o);
  ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(s.skipped_batches, (std::set<std::int64_t>{4}));
}

// Without the store, latest.safetensors carries the skip list and the dropout positions: a resume
// skips the same batches and continues the same masks (bit-identical to not stopping).
TEST_F(Rewind, LatestSafetensorsCarriesTheSkipListAndTheDropoutPositions) {
  const fs::path dir = scratch_dir();
  ImageClassifierOptions o = rewind_options(dir / "whole");
  o.skip_batches = {4};
  TrainingSummary whole = train_image_classifier(o);
  o.out_dir = dir / "stopped";
  o.epochs = 1;
  train_image_classifier(o);
  const io::SafetensorsFile latest =
      io::load_safetensors((dir / "stopped" / "checkpoints" / "latest.safetensors").string());
  EXPECT_EQ(latest.metadata.at("skipped_batches"), "4");
  EXPECT_CONTAINS(latest.metadata.at("random_state"), "\"drop1\"");
  o.epochs = 2;
  o.resume = true;
  o.skip_batches.clear();  // from the checkpoint now
  ::testing::internal::CaptureStdout();
  TrainingSummary resumed = train_image_classifier(o);
  ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(resumed.skipped_batches, (std::set<std::int64_t>{4}));
  EXPECT_EQ(resumed.epochs.back().train_loss, whole.epochs.back().train_loss);
  expect_same_tensors(final_tensors(dir / "whole"), final_tensors(dir / "stopped"));
}

// A kill after step 13 leaves the checkpoints up to iter_0000010 (the state copied here); the
// resume continues mid-epoch and ends bit-identical to the run that never stopped.
TEST_F(Rewind, ResumeFromAMidEpochCheckpointIsBitIdentical) {
  const fs::path dir = scratch_dir();
  ImageClassifierOptions o = rewind_options(dir / "whole");
  o.save_interval = 5;
  ::testing::internal::CaptureStdout();
  TrainingSummary whole = train_image_classifier(o);
  ::testing::internal::GetCapturedStdout();

  const fs::path killed = dir / "killed";
  fs::create_directories(killed / "checkpoints");
  fs::copy(dir / "whole" / "checkpoints" / "iter_0000010", killed / "checkpoints" / "iter_0000010");
  fs::copy(dir / "whole" / "checkpoints" / "iter_0000005", killed / "checkpoints" / "iter_0000005");
  o.out_dir = killed;
  o.resume = true;
  ::testing::internal::CaptureStdout();
  TrainingSummary resumed = train_image_classifier(o);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_CONTAINS(out, "iter_0000010 (step 10, checksums verified)");
  ASSERT_EQ(resumed.epochs.size(), 2u);
  for (std::size_t e = 0; e < 2; ++e) EXPECT_EQ(resumed.epochs[e].train_loss, whole.epochs[e].train_loss);
  expect_same_tensors(final_tensors(dir / "whole"), final_tensors(killed));
}

TEST_F(Rewind, ADamagedCheckpointIsPassedOverOnResume) {
  const fs::path run = scratch_dir() / "run";
  ImageClassifierOptions o = rewind_options(run);
  o.epochs = 1;
  o.save_interval = 10;
  set_fault_plan_for_testing("corrupt_checkpoint@4");  // saves: 10, 20, 30, 32 (epoch end)
  ::testing::internal::CaptureStdout();
  train_image_classifier(o);
  ::testing::internal::GetCapturedStdout();
  set_fault_plan_for_testing("");
  o.epochs = 2;
  o.resume = true;
  ::testing::internal::CaptureStdout();
  TrainingSummary s = train_image_classifier(o);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_CONTAINS(out, "passed over: iter_0000032: model.safetensors: crc32c");
  EXPECT_CONTAINS(out, "iter_0000030 (step 30, checksums verified)");
  EXPECT_EQ(s.epochs.size(), 2u);
}

TEST_F(Rewind, AFullDiskStopsTheRunAndKeepsThePreviousCheckpoint) {
  for (bool async : {false, true}) {
    const fs::path run = scratch_dir() / (async ? "async" : "sync");
    ImageClassifierOptions o = rewind_options(run);
    o.save_interval = 10;
    o.async_save = async;
    set_fault_plan_for_testing("disk_full_in_save@2");
    ::testing::internal::CaptureStdout();
    const std::string error = error_of([&] { train_image_classifier(o); });
    ::testing::internal::GetCapturedStdout();
    EXPECT_CONTAINS(error, "No space left on device");
    EXPECT_CONTAINS(error, "the newest is " + (run / "checkpoints" / "iter_0000010").string());
    if (async) {
      EXPECT_CONTAINS(error, "the background save of iteration 20 failed");
    }
    CheckpointStore store(run / "checkpoints");
    EXPECT_EQ(store.iterations(), (std::vector<std::int64_t>{10}));
    EXPECT_FALSE(store.verify(10).has_value());
  }
}

TEST_F(Rewind, AsyncAndSyncSavesWriteTheSameCheckpoints) {
  const fs::path dir = scratch_dir();
  for (bool async : {false, true}) {
    ImageClassifierOptions o = rewind_options(dir / (async ? "async" : "sync"));
    o.save_interval = 7;
    o.async_save = async;
    o.keep_last = 2;
    ::testing::internal::CaptureStdout();
    TrainingSummary s = train_image_classifier(o);
    ::testing::internal::GetCapturedStdout();
    EXPECT_EQ(s.checkpoints.saves, 11) << "steps 7..63 by 7 except 63 = 9 in-epoch saves, plus 2 epoch ends";
  }
  CheckpointStore sync(dir / "sync" / "checkpoints"), async(dir / "async" / "checkpoints");
  EXPECT_EQ(sync.iterations(), (std::vector<std::int64_t>{63, 64}));
  EXPECT_EQ(async.iterations(), sync.iterations());
  for (std::int64_t it : sync.iterations())
    EXPECT_EQ(read_file(sync.dir_of(it) / "model.safetensors"), read_file(async.dir_of(it) / "model.safetensors"));
}

}  // namespace rewind_test
}  // namespace kiln::train::testing
