// Resuming a CIFAR-10 run: what a killed or mistaken run must not lose, and what a damaged
// checkpoint must not silently do.
#include <nlohmann/json.hpp>

#include "kiln/io/safetensors.h"
#include "kiln/train/training_state.h"
#include "train_test_util.h"

namespace kiln::train::testing {
namespace resume_test {

std::vector<std::int64_t> logged_epochs(const fs::path& log) {
  std::vector<std::int64_t> epochs;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) epochs.push_back(nlohmann::json::parse(line).at("epoch"));
  return epochs;
}

// Rewrites a checkpoint's metadata entry, keeping its tensors.
void set_metadata(const fs::path& file, const std::string& key, const std::string& value) {
  io::SafetensorsFile f = io::load_safetensors(file.string());
  f.metadata[key] = value;
  io::save_safetensors(file.string(), f.tensors, f.metadata);
}

TEST(Resume, WithoutALatestCheckpointRefusesAndChangesNothing) {
  const fs::path run = scratch_dir() / "run";
  // A run folder whose latest checkpoint is gone (or a mistyped one): best and the log are there.
  fs::create_directories(run / "checkpoints");
  write_file(run / "checkpoints" / "best.safetensors", "the best weights of a long run");
  write_file(run / "log.jsonl", "{\"epoch\": 1}\n");
  ImageClassifierOptions o = quick_options(run, 1);
  o.resume = true;
  const std::string error = error_of([&] { train_image_classifier(o); });
  EXPECT_CONTAINS(error, "no checkpoint to resume from in " + run.string());
  EXPECT_CONTAINS(error, "nothing was changed");
  EXPECT_EQ(read_file(run / "checkpoints" / "best.safetensors"), "the best weights of a long run");
  EXPECT_EQ(read_file(run / "log.jsonl"), "{\"epoch\": 1}\n");
}

// A kill after epoch 3's latest.safetensors was written and before best.safetensors and the log
// line were: best still holds an older epoch, the log ends at epoch 2. The resume repairs best
// from latest and restores epoch 3's log line, so the log reads 1, 2, 3, 4.
TEST(Resume, AKillBetweenLatestAndBestIsRepaired) {
  const fs::path dir = scratch_dir(), run = dir / "run";
  ImageClassifierOptions o = quick_options(run, 2);
  train_image_classifier(o);
  const fs::path best = run / "checkpoints" / "best.safetensors", latest = run / "checkpoints" / "latest.safetensors";
  fs::copy_file(best, dir / "old_best.safetensors");
  fs::copy_file(run / "log.jsonl", dir / "old_log.jsonl");
  o.epochs = 3;
  o.resume = true;
  train_image_classifier(o);
  // The state that kill leaves: latest of epoch 3 says epoch 3 is the best; best and the log are older.
  set_metadata(latest, "best_epoch", "3");
  set_metadata(latest, "best_val_accuracy", "1");
  fs::copy_file(latest, dir / "epoch3.safetensors");
  fs::copy_file(dir / "old_best.safetensors", best, fs::copy_options::overwrite_existing);
  fs::copy_file(dir / "old_log.jsonl", run / "log.jsonl", fs::copy_options::overwrite_existing);
  ASSERT_NE(io::load_safetensors(best.string()).metadata.at("epoch"), "3");

  o.epochs = 4;
  ::testing::internal::CaptureStdout();
  train_image_classifier(o);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_CONTAINS(out, "repaired " + best.string());
  EXPECT_CONTAINS(out, "restored epoch 3 from the checkpoint");

  io::SafetensorsFile repaired = io::load_safetensors(best.string());
  EXPECT_EQ(repaired.metadata.at("epoch"), "3") << "best must hold epoch 3 (accuracy 1 cannot be beaten)";
  io::SafetensorsFile epoch3 = io::load_safetensors((dir / "epoch3.safetensors").string());
  for (const auto& [name, t] : repaired.tensors) {
    ASSERT_TRUE(epoch3.tensors.contains(name)) << name;
    EXPECT_EQ(t.to_vector<double>(), epoch3.tensors.at(name).to_vector<double>()) << name;
  }
  EXPECT_EQ(logged_epochs(run / "log.jsonl"), (std::vector<std::int64_t>{1, 2, 3, 4}));
}

TEST(Resume, LogLinesBeyondTheCheckpointAndTornLinesAreDropped) {
  const fs::path run = scratch_dir() / "run";
  ImageClassifierOptions o = quick_options(run, 1);
  train_image_classifier(o);
  // Epoch 2 logged by a run whose checkpoint was lost, then a line cut by a kill.
  std::string log = read_file(run / "log.jsonl");
  write_file(run / "log.jsonl", log + "{\"epoch\": 2, \"train_loss\": 1}\n{\"epoch\": 3, \"tra");
  o.epochs = 2;
  o.resume = true;
  train_image_classifier(o);
  EXPECT_EQ(logged_epochs(run / "log.jsonl"), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(read_file(run / "log.jsonl").substr(0, log.size()), log) << "epoch 1's line is kept as logged";
}

TEST(Resume, InvalidEpochInTheMetadataIsRefused) {
  const fs::path run = scratch_dir() / "run";
  ImageClassifierOptions o = quick_options(run, 1);
  train_image_classifier(o);
  const fs::path latest = run / "checkpoints" / "latest.safetensors";
  const std::string log = read_file(run / "log.jsonl");
  set_metadata(latest, "epoch", "-4");
  o.epochs = 3;
  o.resume = true;
  const std::string error = error_of([&] { train_image_classifier(o); });
  EXPECT_CONTAINS(error, "checkpoint " + latest.string() + ": metadata 'epoch' is '-4'");
  EXPECT_CONTAINS(error, "expected a whole number from 1 to");
  EXPECT_EQ(read_file(run / "log.jsonl"), log) << "nothing trained, nothing logged";
}

TEST(Resume, MissingOptimizerStateIsAnErrorUnlessReset) {
  const fs::path run = scratch_dir() / "run";
  ImageClassifierOptions o = quick_options(run, 1);
  train_image_classifier(o);
  const fs::path latest = run / "checkpoints" / "latest.safetensors";
  io::SafetensorsFile f = io::load_safetensors(latest.string());
  TensorDict model_only;
  for (const auto& [name, t] : f.tensors)
    if (name.starts_with("model.")) model_only.insert(name, t);
  io::save_safetensors(latest.string(), model_only, f.metadata);
  o.epochs = 2;
  o.resume = true;
  const std::string error = error_of([&] { train_image_classifier(o); });
  EXPECT_CONTAINS(error, "checkpoint " + latest.string() + " holds no optimizer state");
  EXPECT_CONTAINS(error, "--reset-optimizer");
  o.reset_optimizer = true;
  ::testing::internal::CaptureStdout();
  TrainingSummary s = train_image_classifier(o);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_CONTAINS(out, "optimizer state reset");
  EXPECT_EQ(s.epochs.size(), 2u);
}

TEST(Resume, ANegativeLimitIsRefusedNamingTheFlag) {
  ImageClassifierOptions o = quick_options(scratch_dir() / "run", 1);
  o.limit_train = -5;
  EXPECT_CONTAINS(error_of([&] { train_image_classifier(o); }), "--limit-train must be >= 0");
  o.limit_train = 64;
  o.lr = std::nan("");
  EXPECT_CONTAINS(error_of([&] { train_image_classifier(o); }), "--lr must be a positive number");
}

TEST(Resume, StaleTemporariesOfKilledRunsAreRemoved) {
  const fs::path run = scratch_dir() / "run";
  fs::create_directories(run / "checkpoints");
  const std::string dead = std::to_string(dead_pid());
  const fs::path stale_ckpt = run / "checkpoints" / (".latest.safetensors.tmp." + dead);
  const fs::path stale_png = run / ("training_curves.png.tmp." + dead);
  write_file(stale_ckpt, std::string(1000, 'x'));
  write_file(stale_png, "x");
  ::testing::internal::CaptureStdout();
  train_image_classifier(quick_options(run, 1));
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_FALSE(fs::exists(stale_ckpt));
  EXPECT_FALSE(fs::exists(stale_png));
  EXPECT_CONTAINS(out, "stale temporar");
  EXPECT_CONTAINS(out, stale_ckpt.string());
}

TEST(Progress, LinesWhenTheOutputIsNotATerminal) {
  ImageClassifierOptions o = quick_options(scratch_dir() / "run", 1);
  o.progress = true;
  o.progress_seconds = 0;
  ::testing::internal::CaptureStdout();  // stdout is a file now: lines, not the bar
  train_image_classifier(o);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_CONTAINS(out, "  epoch 1/1, step 1/2: loss ");
  EXPECT_CONTAINS(out, "left in the epoch");
}

// Unit checks of the metadata reader: every field, named with the file.
TEST(TrainingState, MetadataFieldsAreChecked) {
  TrainingState s;
  s.epoch = 2;
  for (int e = 1; e <= 2; ++e) {
    EpochReport r;
    r.epoch = e;
    r.val_accuracy = 0.25 * e;
    s.history.push_back(r);
  }
  s.best_epoch = 2;
  s.best_val_accuracy = 0.5;
  s.normalization = "half";
  const CheckpointMetadata good = training_metadata("simple_cnn", s);
  const TrainingState back = training_state_from_metadata(good, "ck.safetensors");
  EXPECT_EQ(back.epoch, 2);
  EXPECT_EQ(back.best_epoch, 2);
  EXPECT_EQ(back.history.size(), 2u);
  auto error_with = [&](const std::string& key, const std::string& value) {
    CheckpointMetadata m = good;
    if (value == "<erase>")
      m.erase(key);
    else
      m[key] = value;
    return error_of([&] { training_state_from_metadata(m, "ck.safetensors"); });
  };
  EXPECT_CONTAINS(error_with("epoch", "2x"), "checkpoint ck.safetensors: metadata 'epoch' is '2x'");
  EXPECT_CONTAINS(error_with("epoch", "0"), "metadata 'epoch' is '0'");
  EXPECT_CONTAINS(error_with("epoch", "<erase>"), "its metadata has no 'epoch'");
  EXPECT_CONTAINS(error_with("epoch", "3"), "'history' has 2 entries but 'epoch' says 3");
  EXPECT_CONTAINS(error_with("history", "{"), "metadata 'history' is not valid JSON");
  EXPECT_CONTAINS(error_with("history", "{\"a\": 1}"), "metadata 'history' is not a JSON array");
  EXPECT_CONTAINS(error_with("history", R"([{"epoch": "1"}, {}])"), "'history' entry 1: 'epoch' is \"1\"");
  EXPECT_CONTAINS(error_with("best_epoch", "7"), "metadata 'best_epoch' is '7'; expected a whole number from 1 to 2");
  EXPECT_CONTAINS(error_with("best_val_accuracy", "nan"), "metadata 'best_val_accuracy' is 'nan'");
  EXPECT_CONTAINS(error_with("normalization", "imagenet"), "metadata 'normalization' is 'imagenet'");
  nlohmann::json h = nlohmann::json::parse(good.at("history"));
  h[1]["val_accuracy"] = 3;
  EXPECT_CONTAINS(error_with("history", h.dump()), "entry 2: 'val_accuracy' is 3");
  h[1]["val_accuracy"] = "high";
  EXPECT_CONTAINS(error_with("history", h.dump()), "entry 2: 'val_accuracy' is \"high\"; expected a number");
  // Checkpoints from before best_epoch was recorded: the best comes from the history.
  CheckpointMetadata old = good;
  old.erase("best_epoch");
  old.erase("best_val_accuracy");
  EXPECT_EQ(training_state_from_metadata(old, "ck.safetensors").best_epoch, 2);
}

}  // namespace resume_test
}  // namespace kiln::train::testing
